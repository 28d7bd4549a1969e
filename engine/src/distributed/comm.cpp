#include "distributed/comm.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace simdattn::detail::mpi {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(call, "failed: " + (length > 0 ? std::string(text, static_cast<std::size_t>(length))
                                             : "MPI error code " + std::to_string(rc)));
}

ErrorsReturn::ErrorsReturn(MPI_Comm comm) : comm_(comm) {
  check(MPI_Comm_get_errhandler(comm_, &saved_), "MPI_Comm_get_errhandler");
  const int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Errhandler_free(&saved_);
    check(rc, "MPI_Comm_set_errhandler");
  }
}

ErrorsReturn::~ErrorsReturn() {
  MPI_Comm_set_errhandler(comm_, saved_);
  MPI_Errhandler_free(&saved_);
}

int rank_of(MPI_Comm comm) {
  int r = 0;
  check(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

int size_of(MPI_Comm comm) {
  int n = 0;
  check(MPI_Comm_size(comm, &n), "MPI_Comm_size");
  return n;
}

void Shared::add(const char* name, std::int64_t value) {
  if (size() >= capacity) throw Error("simdattn::mpi", "too many shared arguments (internal)");
  names_.push_back(name);
  values_.push_back(value);
}

void Shared::add_bytes(const char* name, const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  h = (h ^ bytes) * 1099511628211ull;  // an empty option and a zero-filled one differ
  std::int64_t v;
  std::memcpy(&v, &h, sizeof v);
  add(name, v);
}

namespace {

// The argument and message of an Error (what() is "argument: message").
std::string message_of(const Error& e) {
  const std::string what = e.what();
  const std::string prefix = e.argument().empty() ? "" : detail::printable(e.argument()) + ": ";
  return what.compare(0, prefix.size(), prefix) == 0 ? what.substr(prefix.size()) : what;
}

}  // namespace

Gathered agree(MPI_Comm comm, const Outcome& outcome, const Shared& shared, const std::vector<std::int64_t>& own) {
  const int ranks = size_of(comm);
  const int me = rank_of(comm);
  // Per rank: failed flag, the number of shared values, the values (padded), the number of own
  // values, the first kOwnInline of them.
  constexpr int width = 2 + Shared::capacity + 1 + kOwnInline;
  constexpr int own_at = 2 + Shared::capacity;
  std::vector<std::int64_t> mine(width, 0), all(static_cast<std::size_t>(width) * ranks);
  mine[0] = outcome ? 1 : 0;
  mine[1] = shared.size();
  std::copy(shared.values().begin(), shared.values().end(), mine.begin() + 2);
  mine[own_at] = static_cast<std::int64_t>(own.size());
  std::copy(own.begin(), own.begin() + std::min<std::ptrdiff_t>(kOwnInline, static_cast<std::ptrdiff_t>(own.size())),
            mine.begin() + own_at + 1);
  check(MPI_Allgather(mine.data(), width, MPI_INT64_T, all.data(), width, MPI_INT64_T, comm), "MPI_Allgather");
  auto at = [&](int r, int i) { return all[static_cast<std::size_t>(r) * width + static_cast<std::size_t>(i)]; };

  int failed = -1;
  for (int r = 0; r < ranks && failed < 0; ++r)
    if (at(r, 0) != 0) failed = r;
  if (failed >= 0) {
    // The failing rank's argument and message, to every rank.
    std::string argument, message;
    if (me == failed) {
      argument = outcome->argument();
      message = message_of(*outcome);
    }
    std::int64_t lengths[2] = {static_cast<std::int64_t>(argument.size()), static_cast<std::int64_t>(message.size())};
    check(MPI_Bcast(lengths, 2, MPI_INT64_T, failed, comm), "MPI_Bcast");
    std::string text = argument + message;
    text.resize(static_cast<std::size_t>(lengths[0] + lengths[1]));
    check(MPI_Bcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, failed, comm), "MPI_Bcast");
    const auto split = static_cast<std::size_t>(lengths[0]);
    std::string said = text.substr(split);
    if (ranks > 1) said += " (on rank " + std::to_string(failed) + ")";
    throw Error(text.substr(0, split), said);
  }
  for (int r = 1; r < ranks; ++r) {
    if (at(r, 1) != at(0, 1)) throw Error("simdattn::mpi", "ranks call different functions (internal)");
    for (int i = 0; i < at(0, 1); ++i)
      if (at(r, 2 + i) != at(0, 2 + i))
        throw Error(shared.name(i), "rank " + std::to_string(r) + " has " + std::to_string(at(r, 2 + i)) +
                                        ", rank 0 has " + std::to_string(at(0, 2 + i)) +
                                        " (every rank must give the same)");
  }
  bool inline_all = true;
  for (int r = 0; r < ranks; ++r) inline_all = inline_all && at(r, own_at) <= kOwnInline;
  if (!inline_all) return allgather_values(comm, own);  // every rank takes this branch alike
  Gathered g;
  g.offsets.assign(static_cast<std::size_t>(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < at(r, own_at); ++i) g.values.push_back(at(r, own_at + 1 + i));
    g.offsets[static_cast<std::size_t>(r) + 1] = static_cast<std::int64_t>(g.values.size());
  }
  return g;
}

Gathered allgather_values(MPI_Comm comm, const std::vector<std::int64_t>& mine) {
  const int ranks = size_of(comm);
  std::vector<int> counts(static_cast<std::size_t>(ranks)), displs(static_cast<std::size_t>(ranks));
  const int count = static_cast<int>(mine.size());
  check(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm), "MPI_Allgather");
  Gathered g;
  g.offsets.assign(static_cast<std::size_t>(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) {
    displs[static_cast<std::size_t>(r)] = static_cast<int>(g.offsets[static_cast<std::size_t>(r)]);
    g.offsets[static_cast<std::size_t>(r) + 1] = g.offsets[static_cast<std::size_t>(r)] + counts[static_cast<std::size_t>(r)];
  }
  g.values.resize(static_cast<std::size_t>(g.offsets.back()));
  check(MPI_Allgatherv(mine.data(), count, MPI_INT64_T, g.values.data(), counts.data(), displs.data(), MPI_INT64_T,
                       comm),
        "MPI_Allgatherv");
  return g;
}

}  // namespace simdattn::detail::mpi
