// The simdattn command line (tools/cli/main.cpp calls it; tests call it in-process). Exit
// status: 0 success, 2 bad command line or input (one line on stderr naming the argument or file,
// or saying memory ran out), 1 for an unexpected internal failure.
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
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

// "<prefix><what as one line>\n" on stderr, written at once; if even that string cannot be
// allocated, the out-of-memory line instead (never half a line).
void print_error(const char* prefix, const char* what) {
  try {
    const std::string line = prefix + one_line(what) + "\n";
    std::fputs(line.c_str(), stderr);
  } catch (const std::bad_alloc&) {
    std::fputs("simdattn: error: out of memory\n", stderr);
  }
}

int run_unguarded(int argc, char** argv) {
  CLI::App app{"simdattn: SIMD-optimized CPU attention"};
  app.require_subcommand(1);
  std::vector<simdattn::cli::Command> commands{simdattn::cli::add_run_command(app),
                                               simdattn::cli::add_mha_command(app),
                                               simdattn::cli::add_linear_command(app),
                                               simdattn::cli::add_compare_command(app),
                                               simdattn::cli::add_info_command(app)};
  // A clearer message than CLI11's "A subcommand is required" for a missing or unknown command,
  // or an option before it.
  const std::string first = argc < 2 ? std::string() : std::string(argv[1]);
  if (argc < 2 || (first != "-h" && first != "--help" &&
                   app.get_subcommands([&](CLI::App* sub) { return sub->get_name() == first; }).empty())) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
    const std::string what = (argc < 2          ? std::string("no command given")
                              : first[0] == '-' ? "unknown option '" + first + "' before the command"
                                                : "unknown command '" + first + "'") +
                             " (expected one of: " + names + "; see --help)";
    print_error("simdattn: error: ", what.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    print_error("simdattn: error: ", e.what());
    return 2;
  }
  // An option given an empty value ("--mask $M" with M unset) is an error, not "option absent":
  // every option's value is a file, a number or a name (--prefix alone may be empty).
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options())
      for (const std::string& value : opt->results())
        if (value.empty() && opt->get_name() != "--prefix") {
          print_error("simdattn: error: ", (opt->get_name() + ": expected a value, got an empty string").c_str());
          return 2;
        }
  for (auto& c : commands) c();
  return 0;
}

}  // namespace

namespace simdattn::cli {

int report_error(std::exception_ptr error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const Reported& r) {
    return r.status;
  } catch (const UsageError& e) {
    print_error("simdattn: error: ", e.what());
    return 2;
  } catch (const Error& e) {
    print_error("simdattn: error: ", e.what());
    return 2;
  } catch (const std::bad_alloc&) {  // anywhere: building the parser, parsing, a command, a message
    std::fputs("simdattn: error: out of memory: the inputs need more memory than this machine can allocate\n", stderr);
    return 2;
  } catch (const std::exception& e) {
    print_error("simdattn: internal error: ", e.what());
    return 1;
  } catch (...) {
    print_error("simdattn: internal error: ", "an exception of unknown type");
    return 1;
  }
}

int run(int argc, char** argv) noexcept {
  try {
    return run_unguarded(argc, argv);
  } catch (...) {
    return report_error(std::current_exception());
  }
}

}  // namespace simdattn::cli
