// `simdattn info`: version, ISA in use and available, threads, backends, oneDNN version.
#include <iostream>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {

Command add_info_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("info", "Version, ISA, threads and backends of this build");
  return [sub] {
    if (!*sub) return;
    RuntimeInfo info;
    try {
      info = runtime_info();
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    std::cout << "simdattn " << info.version << '\n';
    std::cout << "isa: " << info.isa << (info.isa_forced ? " (forced by SIMDATTN_ISA)" : " (detected)")
              << '\n';
    std::cout << "isa available:";
    for (const auto& s : info.isas) std::cout << ' ' << s;
    std::cout << '\n';
    std::cout << "threads: " << info.default_threads << '\n';
    std::cout << "thread budget: " << info.thread_budget << '\n';
    std::cout << "backends:";
    for (const auto& s : info.backends) std::cout << ' ' << s;
    std::cout << '\n';
    std::cout << "onednn: " << (info.onednn_version.empty() ? "not built" : info.onednn_version) << '\n';
  };
}

}  // namespace simdattn::cli
