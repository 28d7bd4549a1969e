// The simdattn subcommands. Each registers its options on the CLI11 app and returns a callable
// that runs it; errors are thrown as UsageError (exit 2) or simdattn::Error.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace simdattn::cli {

using Command = std::function<void()>;

// The whole command line: argv[1] the command, the rest its options. Prints errors (one line)
// on stderr and returns the exit status; throws nothing (out of memory anywhere: exit 2).
int run(int argc, char** argv) noexcept;

// An error whose line is already printed: run() returns its status and prints nothing more.
struct Reported {
  int status;
};

// Prints the line of a command's error on stderr (as run() does) and returns its exit status:
// 2 for a bad command line or input (UsageError, simdattn::Error, out of memory), 1 for anything
// else; a Reported error prints nothing and gives its own status.
int report_error(std::exception_ptr error) noexcept;

Command add_run_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_mha_command(CLI::App& app);
Command add_linear_command(CLI::App& app);

// The subcommand `name`: `options` binds its options to an Args that CLI11 fills while parsing,
// so the Args lives as long as the returned Command, which calls `run` if the subcommand was given.
template <class Args>
Command add_command(CLI::App& app, const std::string& name, const std::string& description,
                    void (*options)(CLI::App&, Args&), void (*run)(const Args&)) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(name, description);
  options(*sub, *args);
  return [args, sub, run] {
    if (*sub) run(*args);
  };
}

}  // namespace simdattn::cli
