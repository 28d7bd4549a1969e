// `simdattn info`: version, ISA in use and available, threads, backends, oneDNN version, the
// native backend's paths in the order it tries them, the dtypes each backend takes here.
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
    for (const auto& note : info.isa_notes) std::cout << "isa note: " << note << '\n';
    std::cout << "threads: " << info.default_threads << '\n';
    std::cout << "thread budget: " << info.thread_budget << '\n';
    std::cout << "thread runtime: " << info.thread_runtime << '\n';
    std::cout << "backends:";
    for (const auto& s : info.backends) std::cout << ' ' << s;
    std::cout << '\n';
    std::cout << "onednn: " << (info.onednn_version.empty() ? "not built" : info.onednn_version) << '\n';
    for (const auto& path : info.native_paths) std::cout << "native path: " << path << '\n';
    // which dtypes each backend takes here (backend_takes)
    for (Backend b : {Backend::reference, Backend::native, Backend::onednn}) {
      if (!backend_available(b)) continue;
      std::cout << "dtypes " << backend_name(b) << ":";
      for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
        if (backend_takes(b, dt)) std::cout << ' ' << dtype_name(dt);
      std::cout << '\n';
    }
  };
}

}  // namespace simdattn::cli
