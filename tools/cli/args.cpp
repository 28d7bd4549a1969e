#include "args.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <utility>

#include <CLI/CLI.hpp>

#include <unistd.h>

namespace simdattn::cli {

void add_qkv_out_options(CLI::App& sub, std::string& q, std::string& k, std::string& v, std::string& out) {
  sub.add_option("--q", q, "Q [B, H, Sq, D] (.npy, <f4 or <f8)")->required();
  sub.add_option("--k", k, "K [B, Hkv, Sk, D], same dtype as Q")->required();
  sub.add_option("--v", v, "V [B, Hkv, Sk, Dv], same dtype as Q")->required();
  sub.add_option("--out", out, "output O [B, H, Sq, Dv] (.npy, Q's dtype)")->required();
}

void add_threads_option(CLI::App& sub, std::string& threads) {
  sub.add_option("--threads", threads, "threads (>= 1; default: OpenMP's)");
}

void add_backend_threads_options(CLI::App& sub, std::string& backend, std::string& threads,
                                 const std::string& backend_help) {
  sub.add_option("--backend", backend, backend_help);
  add_threads_option(sub, threads);
}

namespace {

// strtod/strtoll accept leading white space, and strtod hexadecimal and inf/nan: a value here is
// a plain decimal number, nothing around it.
bool plain_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return false;
  for (char c : text)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E'))
      return false;
  return true;
}

}  // namespace

double parse_double(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const bool plain = plain_number(text);
  const double v = plain ? std::strtod(text.c_str(), &end) : 0.0;
  // ERANGE also flags an underflow to a subnormal or zero, which is a fine value; overflow is not.
  if (!plain || end != text.c_str() + text.size() || (errno == ERANGE && std::abs(v) > 1.0) ||
      !std::isfinite(v))
    throw UsageError(flag + ": expected a finite decimal number, got '" + text + "'");
  return v;
}

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min,
                       std::int64_t max) {
  errno = 0;
  char* end = nullptr;
  const bool plain = plain_number(text);
  const long long v = plain ? std::strtoll(text.c_str(), &end, 10) : 0;
  if (!plain || end != text.c_str() + text.size() || errno == ERANGE || v < min || v > max)
    throw UsageError(flag + ": expected an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  return v;
}

Causal parse_causal(const std::string& flag, const std::string& text) {
  if (text == "none") return Causal::none;
  if (text == "top-left") return Causal::top_left;
  if (text == "bottom-right") return Causal::bottom_right;
  throw UsageError(flag + ": expected none, top-left or bottom-right, got '" + text + "'");
}

Backend parse_backend(const std::string& flag, const std::string& text) {
  for (Backend b : {Backend::reference, Backend::native, Backend::onednn}) {
    if (text != backend_name(b)) continue;
    if (!backend_available(b))
      throw UsageError(flag + ": backend '" + text + "' is not available in this build");
    return b;
  }
  throw UsageError(flag + ": expected reference, native or onednn, got '" + text + "'");
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    if (text == dtype_name(t)) return t;
  throw UsageError(flag + ": expected f32, f64, bf16 or f16, got '" + text + "'");
}

double element(const NpyArray& a, std::size_t i) {
  switch (a.dtype) {
    case DType::f64: return a.as<double>()[i];
    case DType::f16: return to_float(a.as<float16>()[i]);
    case DType::bf16: return to_float(a.as<bfloat16>()[i]);
    default: return a.as<float>()[i];
  }
}

NpyArray converted(const NpyArray& a, DType to) {
  if (a.dtype == to) return a;
  NpyArray out;
  out.dtype = to;
  out.shape = a.shape;
  const std::size_t n = a.data.size() / dtype_size(a.dtype);
  out.data.resize(n * dtype_size(to));
  for (std::size_t i = 0; i < n; ++i) {
    const double x = element(a, i);
    switch (to) {
      case DType::f64: out.as<double>()[i] = x; break;
      case DType::f16: out.as<float16>()[i] = to_float16(x); break;
      case DType::bf16: out.as<bfloat16>()[i] = to_bfloat16(x); break;
      default: out.as<float>()[i] = static_cast<float>(x); break;
    }
  }
  return out;
}

Window parse_window(const std::string& flag, const std::string& text) {
  const auto comma = text.find(',');
  if (comma == std::string::npos)
    throw UsageError(flag + ": expected LEFT,RIGHT (integers >= 0, or -1 for unbounded), got '" +
                     text + "'");
  constexpr std::int64_t kMax = std::int64_t{1} << 62;
  Window w;
  w.left = parse_int(flag + " LEFT", text.substr(0, comma), -1, kMax);
  w.right = parse_int(flag + " RIGHT", text.substr(comma + 1), -1, kMax);
  return w;
}

int parse_threads(const std::string& text) {
  return static_cast<int>(parse_int("--threads", text, 1, 4096));
}

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string s;
  for (std::int64_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

namespace {

// read_ints / read_floats: the file, its dtype among `ok` (named by `dtypes`) and its shape.
NpyArray load_small(const std::string& flag, const std::string& path, const std::vector<std::int64_t>& shape,
                    const char* what, std::initializer_list<DType> ok, const char* dtypes) {
  NpyArray a = load_npy(flag, path);
  if (std::find(ok.begin(), ok.end(), a.dtype) == ok.end())
    throw UsageError(flag + " " + path + ": expected dtype " + dtypes + ", got " + a.descr());
  if (a.shape != shape)
    throw UsageError(flag + " " + path + ": expected shape (" + dims_text(shape) + (shape.size() == 1 ? ",)" : ")") + " (" +
                     what + ")");
  return a;
}

}  // namespace

std::vector<std::int64_t> read_ints(const std::string& flag, const std::string& path,
                                    const std::vector<std::int64_t>& shape, const char* what) {
  const NpyArray a = load_small(flag, path, shape, what, {DType::i32, DType::i64}, "<i4 or <i8");
  std::vector<std::int64_t> out(static_cast<std::size_t>(a.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = a.dtype == DType::i32 ? a.as<std::int32_t>()[i] : a.as<std::int64_t>()[i];
  return out;
}

std::vector<float> read_floats(const std::string& flag, const std::string& path, const std::vector<std::int64_t>& shape,
                               const char* what) {
  const NpyArray a = load_small(flag, path, shape, what, {DType::f16, DType::f32, DType::f64}, "<f2, <f4 or <f8");
  std::vector<float> out(static_cast<std::size_t>(a.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(element(a, i));
  return out;
}

NpyArray load_npy(const std::string& flag, const std::string& path) {
  try {
    return read_npy(path);
  } catch (const Error& e) {
    throw UsageError(flag + " " + e.what());
  }
}

void check_float_array(const std::string& flag, const std::string& path, const NpyArray& a,
                       std::size_t rank, const std::string& layout, bool f16_ok) {
  if (a.dtype != DType::f32 && a.dtype != DType::f64 && !(f16_ok && a.dtype == DType::f16))
    throw UsageError(flag + " " + path + ": expected dtype " + (f16_ok ? "<f2, <f4 or <f8" : "<f4 or <f8") +
                     ", got " + a.descr());
  if (a.shape.size() != rank)
    throw UsageError(flag + " " + path + ": expected a " + std::to_string(rank) + "-D array" + layout +
                     ", got shape (" + dims_text(a.shape) + ")");
}

Shape4 shape4(const std::string& flag, const std::string& path, const NpyArray& a, bool f16_ok) {
  check_float_array(flag, path, a, 4, "", f16_ok);
  return {a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
}

NpyArray load_bool_npy(const std::string& flag, const std::string& path) {
  NpyArray a = load_npy(flag, path);
  if (a.dtype != DType::u8)
    throw UsageError(flag + " " + path + ": expected dtype |b1 or |u1, got " + a.descr());
  return a;
}

QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v, bool f16_ok) {
  QkvFiles f;
  f.q = load_npy("--q", q);
  f.k = load_npy("--k", k);
  f.v = load_npy("--v", v);
  f.qs = shape4("--q", q, f.q, f16_ok);
  f.ks = shape4("--k", k, f.k, f16_ok);
  f.vs = shape4("--v", v, f.v, f16_ok);
  if (f.k.dtype != f.q.dtype)
    throw UsageError("--k " + k + ": dtype " + f.k.descr() + " differs from --q's " +
                     f.q.descr());
  if (f.v.dtype != f.q.dtype)
    throw UsageError("--v " + v + ": dtype " + f.v.descr() + " differs from --q's " +
                     f.q.descr());
  f.os = with_flag_errors([&] { return attention_output_shape(f.q_view(), f.k_view(), f.v_view()); });
  return f;
}

NpyArray make_output(DType dtype, std::vector<std::int64_t> shape) {
  NpyArray out;
  out.dtype = dtype;
  out.shape = std::move(shape);
  const std::string dims = dims_text(out.shape);
  std::int64_t bytes = static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t d : out.shape)
    if (__builtin_mul_overflow(bytes, d, &bytes))
      throw UsageError("--out: the output [" + dims + "] is too large (its size in bytes overflows)");
  // Larger than the machine's memory: said before asking for it (an allocator may abort on
  // such a request instead of failing it, as AddressSanitizer's does).
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes / page >= pages)
    throw UsageError("--out: the output [" + dims + "], " + std::to_string(bytes) +
                     " bytes, is more than this machine's memory (" +
                     std::to_string(static_cast<std::int64_t>(pages) * page) + " bytes)");
  try {
    out.data.resize(static_cast<std::size_t>(bytes));
  } catch (const std::exception&) {  // bad_alloc or length_error
    throw UsageError("--out: the output [" + dims + "], " + std::to_string(bytes) + " bytes, could not be allocated");
  }
  return out;
}

void save_output(const std::string& path, const NpyArray& a) {
  try {
    write_npy(path, a);
  } catch (const Error& e) {
    throw UsageError(std::string("--out ") + e.what());
  }
}

void add_dtype_option(CLI::App& sub, std::string& dtype) {
  sub.add_option("--dtype", dtype,
                 "f32 | f64 | bf16 | f16: Q, K and V are rounded to it before computing (default: their "
                 ".npy dtype); the output is written in Q's .npy dtype");
}

DtypeChoice parse_dtype_option(const std::string& text) {
  if (text.empty()) return {};
  return {true, parse_dtype("--dtype", text)};
}

void compute_in_dtype(const std::string& path, DtypeChoice choice, QkvFiles& in,
                      const std::function<void(const QkvFiles&, void*)>& compute, bool save) {
  const DType written = in.q.dtype;  // the output's .npy dtype: Q's
  if (choice.given && choice.dtype != written) {
    in.q = converted(in.q, choice.dtype);
    in.k = converted(in.k, choice.dtype);
    in.v = converted(in.v, choice.dtype);
  }
  if (!save) {
    NpyArray o = make_output(in.q.dtype, in.o_shape());
    with_flag_errors([&] { compute(in, o.data.data()); });
    return;
  }
  if (in.q.dtype == written) {
    write_output(path, written, in.o_shape(), [&](void* o) { compute(in, o); });
    return;
  }
  NpyArray o = make_output(in.q.dtype, in.o_shape());
  with_flag_errors([&] { compute(in, o.data.data()); });
  save_output(path, converted(o, written));
}

void write_output(const std::string& path, DType dtype, std::vector<std::int64_t> shape,
                  const std::function<void(void*)>& compute) {
  NpyArray out = make_output(dtype, std::move(shape));
  with_flag_errors([&] { compute(out.data.data()); });
  save_output(path, out);
}

std::string flag_for(const std::string& argument) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"q", "--q"},
      {"k", "--k"},
      {"v", "--v"},
      {"out", "--out"},
      {"g", "--g"},
      {"beta", "--beta"},
      {"x", "--x"},
      {"options.initial_state", "--initial-state"},
      {"options.final_state", "--final-state"},
      {"query", "--query"},
      {"key", "--key"},
      {"value", "--value"},
      {"heads", "--heads"},
      {"config.heads", "--heads"},
      {"kv_heads", "--kv-heads"},
      {"config.kv_heads", "--kv-heads"},
      {"options.mask", "--mask"},
      {"options.key_padding_mask", "--key-padding-mask"},
      {"options.key_lengths", "--key-lengths"},
      {"options.window", "--window"},
      {"options.scale", "--scale"},
      {"options.causal", "--causal"},
      {"options.threads", "--threads"},
      {"options.backend", "--backend"},
      {"options.global_tokens", "--global-tokens"},
      {"options.block_mask", "--block-mask"},
      {"options.block_size", "--block-size"},
      {"options.softcap", "--softcap"},
      {"options.alibi_slopes", "--alibi-slopes"},
      {"options.relative_bias.table", "--t5-bias"},
      {"options.relative_bias.max_distance", "--t5-max-distance"},
      {"options.sinks", "--sinks"},
      {"options.query_offsets", "--query-offset"},
      {"options.lse", "--lse-out"},
      {"options.scores", "--scores-out"},
      {"options.positions", "--positions"},
      {"config.rotary_dim", "--rotary-dim"},
      {"config.theta", "--rope-theta"},
      {"config.factor", "--rope-factor"},
      {"config.high_freq_factor", "--rope-high-freq-factor"},
      {"config.original_max_positions", "--rope-original-max-positions"},
      {"layer", "--layer"},
      {"stack", "--stack"},
      {"attention", "--attention"},
      {"dtype", "--dtype"},
  };
  for (const auto& [name, flag] : kFlags)
    if (argument == name) return flag;
  return argument;
}

UsageError usage_error(const Error& e) {
  const std::string flag = flag_for(e.argument());
  std::string msg = e.what();
  if (flag != e.argument() && msg.rfind(e.argument() + ": ", 0) == 0)
    msg = flag + ": " + msg.substr(e.argument().size() + 2);
  return UsageError(msg);
}

}  // namespace simdattn::cli
