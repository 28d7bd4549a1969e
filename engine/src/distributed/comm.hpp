// The MPI plumbing of simdattn::mpi: errors from MPI calls, and the ranks' agreement on their
// arguments before any data moves (simdattn/mpi.hpp, "Errors").
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "simdattn/error.hpp"

namespace simdattn::detail::mpi {

// Throws Error(call, MPI's error string) unless rc is MPI_SUCCESS.
void check(int rc, const char* call);

// MPI_ERRORS_RETURN on a communicator for a scope (the caller's handler restored after it), so
// that a failing call returns its code to check() instead of aborting the job.
class ErrorsReturn {
 public:
  explicit ErrorsReturn(MPI_Comm comm);
  ~ErrorsReturn();
  ErrorsReturn(const ErrorsReturn&) = delete;
  ErrorsReturn& operator=(const ErrorsReturn&) = delete;

 private:
  MPI_Comm comm_;
  MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
};

// The arguments every rank must give alike, each a named integer (a shape, a flag, a hash of an
// option's values). Filled from the raw arguments before they are checked, so that every rank
// describes the same list whatever its checks find.
class Shared {
 public:
  static constexpr int capacity = 40;
  void add(const char* name, std::int64_t value);
  // A 64-bit hash (FNV-1a) of bytes: options whose values must agree (key lengths, slopes, ...).
  void add_bytes(const char* name, const void* data, std::size_t bytes);
  int size() const { return static_cast<int>(values_.size()); }
  const std::vector<std::int64_t>& values() const { return values_; }
  const char* name(int i) const { return names_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<const char*> names_;
  std::vector<std::int64_t> values_;
};

// This rank's outcome of its checks: empty when they passed.
using Outcome = std::optional<Error>;

// Every rank's int64 values, rank after rank (offsets[r] .. offsets[r + 1]).
struct Gathered {
  std::vector<std::int64_t> values;
  std::vector<std::int64_t> offsets;  // ranks + 1 entries
};

// Collective. Returns when every rank's checks passed and every rank's Shared equals rank 0's;
// otherwise throws on every rank the same Error: the lowest failing rank's own, or one naming
// the first argument that differs ("q.shape[2]: rank 1 has 7, rank 0 has 8 (...)"). `own`: values
// of this rank's own (its key ranges) that every rank receives, in the same message when every
// rank has at most kOwnInline of them (one collective for a decode step's checks), else in two
// more collectives.
inline constexpr int kOwnInline = 8;
Gathered agree(MPI_Comm comm, const Outcome& outcome, const Shared& shared, const std::vector<std::int64_t>& own = {});

// Collective: every rank's values.
Gathered allgather_values(MPI_Comm comm, const std::vector<std::int64_t>& mine);

// Runs f, returning the Error it throws; any other exception (out of memory) becomes an Error
// too, so that the other ranks hear of it instead of waiting for this one.
template <class F>
Outcome outcome_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error("simdattn::mpi", e.what());
  }
  return std::nullopt;
}

int rank_of(MPI_Comm comm);
int size_of(MPI_Comm comm);

}  // namespace simdattn::detail::mpi
