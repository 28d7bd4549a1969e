// simdattn command-line tool: tools/cli/app.cpp (exit status 0 success, 2 bad command line or
// input, 1 internal failure).
#include "commands.hpp"

int main(int argc, char** argv) { return simdattn::cli::run(argc, argv); }
