// The simdattn subcommands. Each registers its options on the CLI11 app and returns a callable
// that runs it; errors are thrown as UsageError (exit 2) or simdattn::Error.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace simdattn::cli {

using Command = std::function<void()>;

Command add_run_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_mha_command(CLI::App& app);
Command add_linear_command(CLI::App& app);

}  // namespace simdattn::cli
