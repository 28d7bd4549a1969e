// simdattn command-line tool. Exit status: 0 success, 2 bad command line or input (one line on
// stderr naming the argument or file), 1 for an unexpected internal failure.
#include <iostream>
#include <string>
#include <vector>

#include "args.hpp"
#include "simdattn/error.hpp"
#include "commands.hpp"

namespace {

// One line of printable text: line breaks become spaces, other control bytes and invalid UTF-8
// (from a malformed file or argument) \xNN.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return simdattn::detail::printable(s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"simdattn: SIMD-optimized CPU attention"};
  app.require_subcommand(1);
  std::vector<simdattn::cli::Command> commands{simdattn::cli::add_run_command(app),
                                               simdattn::cli::add_mha_command(app),
                                               simdattn::cli::add_linear_command(app),
                                               simdattn::cli::add_compare_command(app),
                                               simdattn::cli::add_info_command(app)};
  // A clearer message than CLI11's "A subcommand is required" for a missing or unknown command.
  if (argc < 2 || (argv[1][0] != '-' && app.get_subcommands([&](CLI::App* sub) {
                                           return sub->get_name() == argv[1];
                                         }).empty())) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
    std::cerr << "simdattn: error: " << (argc < 2 ? std::string("no command given")
                                                  : "unknown command '" + std::string(argv[1]) + "'")
              << " (expected one of: " << names << "; see --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "simdattn: error: " << one_line(e.what()) << '\n';
    return 2;
  }
  try {
    for (auto& c : commands) c();
  } catch (const simdattn::cli::UsageError& e) {
    std::cerr << "simdattn: error: " << one_line(e.what()) << '\n';
    return 2;
  } catch (const simdattn::Error& e) {
    std::cerr << "simdattn: error: " << one_line(e.what()) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "simdattn: internal error: " << one_line(e.what()) << '\n';
    return 1;
  }
  return 0;
}
