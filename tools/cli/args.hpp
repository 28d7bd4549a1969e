// What the subcommands share: strict parsing of option values, the options they have in common,
// loading .npy inputs and writing the output, with errors that name the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "simdattn/simdattn.hpp"

namespace CLI {
class App;
}

namespace simdattn::cli {

// A bad command line or input file: printed as one line, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_double(const std::string& flag, const std::string& text);
std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min,
                       std::int64_t max);
Causal parse_causal(const std::string& flag, const std::string& text);
Backend parse_backend(const std::string& flag, const std::string& text);
Window parse_window(const std::string& flag, const std::string& text);
// --threads: 1 to 4096.
int parse_threads(const std::string& text);

// "d0, d1, ...": a shape as the error messages print it.
std::string dims_text(const std::vector<std::int64_t>& dims);

// Reads a .npy file given to `flag`; errors become UsageError("--flag PATH: ...").
NpyArray load_npy(const std::string& flag, const std::string& path);

// An f32 or f64 (or, with f16_ok, f16) array of `rank` dimensions; `layout` (" [B, S, E]", or
// empty) follows "expected a N-D array" in the error.
void check_float_array(const std::string& flag, const std::string& path, const NpyArray& a,
                       std::size_t rank, const std::string& layout, bool f16_ok = false);

// A 4-D attention input: rank 4, dtype f32 or f64 (or, with f16_ok, f16).
Shape4 shape4(const std::string& flag, const std::string& path, const NpyArray& a, bool f16_ok = false);

// --dtype: f32, f64, bf16 or f16.
DType parse_dtype(const std::string& flag, const std::string& text);

// `a` with its elements converted to `to` (rounded to nearest even; a copy even when the same).
NpyArray converted(const NpyArray& a, DType to);

// Element i of an f32, f64, bf16 or f16 array, widened exactly.
double element(const NpyArray& a, std::size_t i);

// A small integer (<i4 or <i8, as int64) or float (<f2, <f4 or <f8, as f32) array of exactly
// `shape` given to `flag`: key lengths, query offsets, positions, slopes, sinks. `what` says what
// the entries are, in the error.
std::vector<std::int64_t> read_ints(const std::string& flag, const std::string& path,
                                    const std::vector<std::int64_t>& shape, const char* what);
std::vector<float> read_floats(const std::string& flag, const std::string& path, const std::vector<std::int64_t>& shape,
                               const char* what);

// A boolean mask file (|b1 or |u1) given to `flag`.
NpyArray load_bool_npy(const std::string& flag, const std::string& path);

// --q, --k, --v of the run and linear commands: rank 4, f32 or f64 (or, with f16_ok, f16), one
// dtype, shapes that fit together (checked before the output is allocated: a zero-size input can
// declare any shape).
struct QkvFiles {
  NpyArray q, k, v;
  Shape4 qs{}, ks{}, vs{};
  Shape4 os{};  // the output's [B, H, Sq, Dv], from attention_output_shape
  ConstTensorView q_view() const { return ConstTensorView(q.data.data(), q.dtype, qs); }
  ConstTensorView k_view() const { return ConstTensorView(k.data.data(), k.dtype, ks); }
  ConstTensorView v_view() const { return ConstTensorView(v.data.data(), v.dtype, vs); }
  std::vector<std::int64_t> o_shape() const { return {os[0], os[1], os[2], os[3]}; }
  TensorView o_view(void* data) const { return TensorView(data, q.dtype, os); }
};
QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v, bool f16_ok = false);

// The required --q, --k, --v and --out options of the run and linear commands.
void add_qkv_out_options(CLI::App& sub, std::string& q, std::string& k, std::string& v, std::string& out);

// --threads, as every command spells it.
void add_threads_option(CLI::App& sub, std::string& threads);

// --backend (described by `backend_help`), then --threads.
void add_backend_threads_options(CLI::App& sub, std::string& backend, std::string& threads,
                                 const std::string& backend_help);

// A zeroed output array of `dtype` and `shape`; UsageError naming --out if its size in bytes
// overflows or cannot be allocated.
NpyArray make_output(DType dtype, std::vector<std::int64_t> shape);

// --dtype of run and linear (empty: none): Q, K and V rounded to it when it is not theirs, then
// `compute` (given the output's bytes, in that dtype) and the output saved to `path` in Q's .npy
// dtype (converted when they differ). The dtype is parsed before the files are read.
struct DtypeChoice {
  bool given = false;
  DType dtype = DType::f32;
};
DtypeChoice parse_dtype_option(const std::string& text);
void add_dtype_option(CLI::App& sub, std::string& dtype);
// With save = false the output is computed and not written (the ranks of --context-parallel
// other than rank 0).
void compute_in_dtype(const std::string& path, DtypeChoice choice, QkvFiles& in,
                      const std::function<void(const QkvFiles&, void*)>& compute, bool save = true);

// write_npy, with errors naming --out.
void save_output(const std::string& path, const NpyArray& a);

// The output of run, linear and mha: make_output(dtype, shape), filled by `compute` (given its bytes;
// an Error it throws becomes usage_error), then save_output(path).
void write_output(const std::string& path, DType dtype, std::vector<std::int64_t> shape,
                  const std::function<void(void*)>& compute);

// The API's argument names in an Error (q, options.mask, config.heads, ...) as the flags the
// user typed (--q, --mask, --heads, ...); other names are returned unchanged.
std::string flag_for(const std::string& argument);

// The Error as a UsageError whose message starts with the flag instead of the argument name.
UsageError usage_error(const Error& e);

// Runs `f`; an Error it throws is rethrown as usage_error.
template <class F>
decltype(auto) with_flag_errors(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw usage_error(e);
  }
}

}  // namespace simdattn::cli
