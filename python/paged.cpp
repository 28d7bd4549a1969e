// The Python module's paged attention: attention_paged over caches in blocks, the KvPool class
// and MultiHeadAttention.forward_pool (module.cpp binds them, after the layer).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <span>
#include <string>
#include <vector>

#include "convert.hpp"
#include "module.hpp"
#include "simdattn/simdattn.hpp"

namespace simdattn::python {
namespace {

// The block table as int32 rows (int32 or int64 entries that fit).
std::vector<std::int32_t> table_of(const py::object& o, std::int64_t& rows, std::int64_t& cols) {
  const py::array t = py::array::ensure(o);  // an array, or a nested sequence made one
  if (!t) throw Error("block_table", "expected a 2-D array of block indices [N, max_blocks]");
  if (t.ndim() != 2) throw Error("block_table", "expected a 2-D array [N, max_blocks], got " + std::to_string(t.ndim()) + "-D");
  const DType d = dtype_of_array(t, "block_table");
  if (d != DType::i32 && d != DType::i64)
    throw Error("block_table", "expected int32 or int64 entries, got " + std::string(dtype_name(d)));
  rows = t.shape(0), cols = t.shape(1);
  const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> a(t);
  std::vector<std::int32_t> out(static_cast<std::size_t>(a.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t x = a.data()[i];
    // out of int32's range: a block index no pool has (the C++ check names the entry)
    out[i] = x < std::numeric_limits<std::int32_t>::min() || x > std::numeric_limits<std::int32_t>::max()
                 ? std::numeric_limits<std::int32_t>::min()
                 : static_cast<std::int32_t>(x);
  }
  return out;
}

// A bool or uint8 mask (a tree mask) as row-major bytes, nonzero: sees. `shape`: the dimensions
// it must have, -1 for any length.
std::vector<std::uint8_t> mask_bytes(const py::handle& o, const std::string& name, const std::vector<std::int64_t>& shape) {
  const Array a = array_of(o, name);
  bool fits = a.ndim() == static_cast<int>(shape.size());
  std::string want = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    want += (i ? ", " : "") + (shape[i] < 0 ? std::string("n") : std::to_string(shape[i]));
    fits = fits && (shape[i] < 0 || a.shape[i] == shape[i]);
  }
  if (!fits) throw Error(name, "expected a " + std::to_string(shape.size()) + "-D array " + want + "]");
  if (a.dtype != DType::u8) throw Error(name, "expected bool or uint8 elements, got " + a.dtype_text());
  const std::int64_t rows = a.ndim() == 2 ? a.shape[0] : 1, cols = a.shape.back(), rs = a.ndim() == 2 ? a.strides[0] : 0;
  const auto* d = static_cast<const std::uint8_t*>(a.data);
  std::vector<std::uint8_t> m;
  m.reserve(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) m.push_back(d[r * rs + c * a.strides.back()] != 0);
  return m;
}

// A given mask's span: not null even when empty (an empty mask is given, not absent).
std::span<const std::uint8_t> given_span(const std::vector<std::uint8_t>& m) {
  static const std::uint8_t kNoElement = 0;
  return {m.empty() ? &kNoElement : m.data(), m.size()};
}

// A [T, H] f32 array as the [1, T, H, 1] view of an lse (name: the argument).
template <class View>
View lse_view(const Array& a, const std::string& name) {
  if (a.ndim() != 2) throw Error(name, "expected a 2-D array [T, H], got " + std::to_string(a.ndim()) + "-D");
  if (a.dtype != DType::f32) throw Error(name, "expected float32, got " + a.dtype_text());
  if (std::is_same_v<View, TensorView> && !a.writeable) throw Error(name, "expected a writeable array");
  View v;
  v.data = a.data;
  v.dtype = DType::f32;
  v.shape = {1, a.shape[0], a.shape[1], 1};
  v.strides = {a.shape[0] * a.shape[1], a.strides[0], a.strides[1], 1};
  return v;
}

py::object attention_paged_py(const py::object& q_in, const py::object& k_in, const py::object& v_in,
                              const py::object& block_table, const py::object& seq_lens, const py::object& query_start,
                              const py::object& causal, const py::object& scale, const py::object& window,
                              const py::object& softcap, const py::object& alibi_slopes, const py::object& sinks,
                              const py::object& tree_mask, const py::object& tree_mask_start, const py::object& lse,
                              bool return_lse, int threads, const py::object& out, const std::string& backend,
                              const py::object& dtype, const py::object& k_scale, const py::object& v_scale,
                              const py::object& kv_dtype) {
  PagedAttentionOptions o;
  std::vector<std::int64_t> starts, lens = vector_of<std::int64_t>(seq_lens, "seq_lens");
  if (!query_start.is_none()) starts = vector_of<std::int64_t>(query_start, "query_start"), o.query_start = starts;
  std::vector<std::uint8_t> tree;
  std::vector<std::int64_t> tree_starts;
  if (!tree_mask.is_none()) tree = mask_bytes(tree_mask, "tree_mask", {-1}), o.tree_mask = given_span(tree);
  if (!tree_mask_start.is_none()) tree_starts = vector_of<std::int64_t>(tree_mask_start, "tree_mask_start"), o.tree_mask_start = tree_starts;
  if (causal.is_none()) o.causal = Causal::none;
  else if (py::isinstance<py::bool_>(causal)) o.causal = causal.cast<bool>() ? Causal::bottom_right : Causal::none;
  else o.causal = causal_of(causal);
  if (!scale.is_none()) o.scale = scale.cast<double>();
  o.window = window_of(window);
  if (!softcap.is_none()) o.softcap = softcap.cast<double>();
  const std::vector<float> slopes = vector_of<float>(alibi_slopes, "alibi_slopes"), sink = vector_of<float>(sinks, "sinks");
  if (!alibi_slopes.is_none()) o.alibi_slopes = slopes;
  if (!sinks.is_none()) o.sinks = sink;
  o.threads = threads;
  o.backend = backend_of(backend);
  std::int64_t rows = 0, cols = 0;
  const std::vector<std::int32_t> table = table_of(block_table, rows, cols);

  const Array q = array_of(q_in, "q"), k = array_of(k_in, "k_cache"), v = array_of(v_in, "v_cache");
  const std::optional<DType> as = optional_dtype(dtype, "dtype");
  if (as && *as != DType::bf16 && *as != q.dtype)
    throw Error("dtype", "converts to 'bf16' only; the other dtypes are the arrays' own");
  const bool bf16 = as == DType::bf16 && q.dtype != DType::bf16;
  if (q.ndim() != 3) throw Error("q", "expected a 3-D array [total_q, H, D], got " + std::to_string(q.ndim()) + "-D");
  Converted q16, k16, v16;
  ConstTensorView qv, kv, vv;
  const bool coded = !kv_dtype.is_none();  // the caches hold codes: set_kv_codes views them
  if (bf16) {
    q16 = converted(q, DType::bf16, "q"), qv = const_view(q16.array, "q", 3);
    if (!coded) {
      k16 = converted(k, DType::bf16, "k_cache"), v16 = converted(v, DType::bf16, "v_cache");
      kv = const_view(k16.array, "k_cache"), vv = const_view(v16.array, "v_cache");
    }
  } else {
    qv = const_view(q, "q", 3);
    if (!coded) kv = const_view(k, "k_cache"), vv = const_view(v, "v_cache");
  }
  std::vector<Array> scales;
  set_kv_codes(kv_dtype, k, v, "k_cache", "v_cache", k_scale, v_scale, "[num_blocks, block_size, Hkv]", kv, vv, scales, o);
  const std::int64_t total_q = qv.shape[1], H = qv.shape[2], Dv = vv.shape[3];
  // dtype='bf16' computes in bf16 and returns float32 (NumPy has no bfloat16)
  const Output result = output_of(out, q, bf16 ? DType::f32 : qv.dtype, qv.dtype, {total_q, H, Dv});
  std::optional<Output> lse_out;
  if (!lse.is_none() || return_lse) {
    lse_out = output_of(lse, q, DType::f32, DType::f32, {total_q, H}, false, "lse");
    o.lse = lse_view<TensorView>(lse_out->array, "lse");
  }
  const BlockTable bt{table.data(), rows, cols, cols};
  {
    py::gil_scoped_release release;
    attention_paged(qv, kv, vv, bt, lens, result.view, o);
    result.finish();
  }
  if (return_lse) return py::make_tuple(result.object, lse_out->object);
  return result.object;
}

py::tuple merge_attention_states_py(const py::object& out_a, const py::object& lse_a, const py::object& out_b,
                                    const py::object& lse_b, const py::object& out, const py::object& lse) {
  const Array a = array_of(out_a, "out_a"), b = array_of(out_b, "out_b");
  const Array la = array_of(lse_a, "lse_a"), lb = array_of(lse_b, "lse_b");
  if (a.ndim() != 3) throw Error("out_a", "expected a 3-D array [T, H, Dv], got " + std::to_string(a.ndim()) + "-D");
  if (b.ndim() != 3) throw Error("out_b", "expected a 3-D array [T, H, Dv], got " + std::to_string(b.ndim()) + "-D");
  const ConstTensorView av = const_view(a, "out_a", 3), bv = const_view(b, "out_b", 3);
  const ConstTensorView lav = lse_view<ConstTensorView>(la, "lse_a"), lbv = lse_view<ConstTensorView>(lb, "lse_b");
  const Output o = output_of(out, a, a.dtype, a.dtype, a.shape, false, "out");
  const Output l = output_of(lse, a, DType::f32, DType::f32, {a.shape[0], a.shape[1]}, false, "lse");
  const TensorView lv = lse_view<TensorView>(l.array, "lse");
  {
    py::gil_scoped_release release;
    merge_attention_states(av, lav, bv, lbv, o.view, lv);
  }
  return py::make_tuple(o.object, l.object);
}

// A layer's pool view as a NumPy array sharing the pool's memory (f32 and f16 pools).
py::array cache_array(const KvPool& pool, const ConstTensorView& v, const py::object& owner) {
  if (pool.dtype() == DType::bf16) throw Error("pool", "NumPy has no bfloat16: a bf16 pool's blocks have no array view");
  const auto item = static_cast<py::ssize_t>(dtype_size(v.dtype));
  std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end()), strides;
  for (auto s : v.strides) strides.push_back(static_cast<py::ssize_t>(s) * item);
  py::array a(numpy_dtype(v.dtype), shape, strides, v.data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// A [T, d_model] step of one sequence as a [1, T, d_model] batch (name: the argument).
SeqInput step_input(const py::handle& x, DType t, const std::string& name) {
  Array a = array_of(x, name);
  if (a.ndim() != 2) throw Error(name, "expected a 2-D array [T, d_model], got " + std::to_string(a.ndim()) + "-D");
  a.shape.insert(a.shape.begin(), 1), a.strides.insert(a.strides.begin(), 0);
  return seq_input(a, t, name.c_str());
}

py::list forward_pool_py(const MultiHeadAttention& layer, const std::vector<KvPool::Sequence>& sequences,
                         const py::list& queries, KvPool& pool, std::int64_t layer_index, const py::object& positions,
                         const py::object& tree_masks, int threads, const std::string& backend) {
  if (static_cast<std::size_t>(py::len(queries)) != sequences.size())
    throw Error("queries", "expected one query array per sequence (" + std::to_string(sequences.size()) + "), got " +
                               std::to_string(py::len(queries)));
  const DType t = layer.dtype();
  const std::int64_t d = layer.config().d_model;
  std::vector<SeqInput> in;
  in.reserve(sequences.size());  // the steps point into them
  std::vector<std::vector<std::int64_t>> pos(sequences.size());
  std::vector<Output> outs;
  outs.reserve(sequences.size());
  std::vector<PoolStep> steps(sequences.size());
  if (!positions.is_none() && static_cast<std::size_t>(py::len(positions)) != sequences.size())
    throw Error("positions", "expected one positions array (or None) per sequence");
  if (!tree_masks.is_none() && static_cast<std::size_t>(py::len(tree_masks)) != sequences.size())
    throw Error("tree_masks", "expected one [T, T] mask (or None) per sequence");
  std::vector<std::vector<std::uint8_t>> trees(sequences.size());
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const std::string name = "queries[" + std::to_string(i) + "]";
    in.push_back(step_input(queries[i], t, name));
    const std::int64_t T = in.back().view.S;
    outs.push_back(output_of(py::none(), in.back().array, layer_output_dtype(t, in.back().array), t, {T, d}));
    SeqView ov;
    ov.data = outs.back().view.data, ov.dtype = t, ov.B = 1, ov.S = T, ov.E = d;
    if (!positions.is_none() && !py::object(positions[py::int_(i)]).is_none())
      pos[i] = vector_of<std::int64_t>(py::array(positions[py::int_(i)]).attr("reshape")(-1), "positions");
    steps[i] = {in.back().view, sequences[i], ov, pos[i]};
    if (!tree_masks.is_none() && !py::object(tree_masks[py::int_(i)]).is_none()) {
      trees[i] = mask_bytes(tree_masks[py::int_(i)], "tree_masks[" + std::to_string(i) + "]", {T, T});
      steps[i].tree_mask = given_span(trees[i]);
    }
  }
  MhaOptions o;
  o.threads = threads;
  o.backend = backend_of(backend);
  {
    py::gil_scoped_release release;
    layer.forward_pool(steps, pool, layer_index, o);
    for (const Output& out : outs) out.finish();
  }
  py::list result;
  for (const Output& out : outs) result.append(out.object);
  return result;
}

// One step through the scheduler: query [T, d_model] -> out [T, d_model].
py::object scheduler_step_py(PoolScheduler& sched, const MultiHeadAttention& layer, KvPool::Sequence seq,
                             const py::object& query, const py::object& positions, const py::object& tree_mask) {
  const DType t = layer.dtype();
  const std::int64_t d = layer.config().d_model;
  const SeqInput in = step_input(query, t, "query");
  const std::int64_t T = in.view.S;
  const Output out = output_of(py::none(), in.array, layer_output_dtype(t, in.array), t, {T, d});
  SeqView ov;
  ov.data = out.view.data, ov.dtype = t, ov.B = 1, ov.S = T, ov.E = d;
  std::vector<std::int64_t> pos;
  if (!positions.is_none()) pos = vector_of<std::int64_t>(py::array(positions).attr("reshape")(-1), "positions");
  PoolStep step{in.view, seq, ov, pos};
  std::vector<std::uint8_t> tree;
  if (!tree_mask.is_none()) tree = mask_bytes(tree_mask, "tree_mask", {T, T}), step.tree_mask = given_span(tree);
  {
    py::gil_scoped_release release;
    sched.step(step);
    out.finish();
  }
  return out.object;
}

// The scheduler with the layer it runs (step() needs the layer's dtype and width).
struct PyPoolScheduler {
  const MultiHeadAttention& layer;
  PoolScheduler sched;
};

}  // namespace

void bind_paged(py::module_& m) {
  m.def("attention_paged", &attention_paged_py, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("block_table"), py::arg("seq_lens"), py::kw_only(), py::arg("query_start") = py::none(),
        py::arg("causal") = "bottom_right", py::arg("scale") = py::none(), py::arg("window") = py::none(),
        py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
        py::arg("tree_mask") = py::none(), py::arg("tree_mask_start") = py::none(), py::arg("lse") = py::none(),
        py::arg("return_lse") = false, py::arg("threads") = 0, py::arg("out") = py::none(),
        py::arg("backend") = "native", py::arg("dtype") = py::none(), py::arg("k_scale") = py::none(),
        py::arg("v_scale") = py::none(), py::arg("kv_dtype") = py::none(),
        R"doc(Attention of many sequences' new tokens over K/V caches in blocks (FlashAttention's
flash_attn_with_kvcache block_table and flash_attn_varlen_func cu_seqlens conventions).

  q        [total_q, H, D]   the new tokens of every sequence, sequence by sequence
  k_cache  [num_blocks, block_size, Hkv, D], v_cache [num_blocks, block_size, Hkv, Dv]
           (any strides, read in place); float32 or float16 (dtype='bf16': bf16 copies)
  block_table [N, max_blocks] int32/int64: sequence i's token t is in block
           block_table[i, t // block_size], slot t % block_size
  seq_lens [N]: sequence i's keys, its new tokens counted (already in the cache)
  query_start [N+1] offsets into q (cu_seqlens_q); None: one token per sequence
  causal   'bottom_right' (default: query j of a sequence at position
           seq_len - query_len + j sees keys <= it) or None/'none' (every key)
  scale, window=(left, right), softcap, alibi_slopes [H], sinks [H]: as attention()
  kv_dtype 'int8', 'fp8_e4m3' or 'fp8_e5m2': the caches hold 8-bit codes (int8, or uint8
           holding fp8; quantize_kv), with k_scale and v_scale float32 [num_blocks, block_size, Hkv]
  tree_mask 1-D bool/uint8: the row-major [q_len_i, q_len_i] matrices M_i of the sequences,
           one after another (or at tree_mask_start [N+1]); new token j of sequence i sees its
           context (keys < seq_len - q_len) and the new tokens j' with M_i[j, j'] nonzero (causal
           ignored; window and alibi_slopes refused)
  lse      float32 [total_q, H]: each row's log-sum-exp (sinks included), written; return_lse=True
           returns (out, lse), allocating lse when not given
Returns out [total_q, H, Dv] (written into `out` when given), or (out, lse).)doc");

  m.def("merge_attention_states", &merge_attention_states_py, py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"),
        py::arg("lse_b"), py::kw_only(), py::arg("out") = py::none(), py::arg("lse") = py::none(),
        R"doc(Merges two attention states of the same rows over two key sets (FlashInfer's merge_state):
out_a, out_b [T, H, Dv] (float32, float16 or bfloat16), lse_a, lse_b float32 [T, H]. With
m = max(lse_a, lse_b), w = exp(lse - m): out = (w_a out_a + w_b out_b) / (w_a + w_b),
lse = m + log(w_a + w_b); rows whose two lse are -inf give 0 and -inf. out / lse may be
out_a / lse_a themselves (in place). Returns (out, lse).)doc");

  py::class_<KvPool>(m, "KvPool", R"doc(A paged KV cache: the keys and values of `layers` layers in `num_blocks` blocks of
`block_size` tokens, shared by sequences (handles: ints) with copy-on-write after fork().)doc")
      .def(py::init([](const MultiHeadAttention& layer, std::int64_t num_blocks, std::int64_t block_size,
                       std::int64_t layers, const py::object& dtype) {
             const std::optional<DType> t = cache_dtype_of(dtype, "dtype");
             return KvPool(layer, num_blocks, block_size, layers, t ? *t : layer.dtype());
           }),
           py::arg("layer"), py::arg("num_blocks"), py::arg("block_size") = kDefaultBlockSize, py::arg("layers") = 1,
           py::arg("dtype") = py::none())
      .def("add", &KvPool::add, "A new, empty sequence.")
      .def("fork", &KvPool::fork, py::arg("parent"), "A new sequence sharing every block of `parent`.")
      .def("truncate", &KvPool::truncate, py::arg("sequence"), py::arg("length"))
      .def("accept", [](KvPool& p, KvPool::Sequence seq, std::int64_t first, const py::object& kept) {
             const std::vector<std::int64_t> k = vector_of<std::int64_t>(kept, "kept");
             p.accept(seq, first, k);
           }, py::arg("seq"), py::arg("first"), py::arg("kept"),
           R"doc(Keeps, of sequence seq's tokens at positions first .. length - 1 (a verification step's
drafts), those at relative indices `kept` (strictly increasing), moved to positions first,
first + 1, ... in every layer; the length becomes first + len(kept). Freed blocks return to the
pool; blocks shared with a fork are copied first. A bad argument changes nothing.)doc")
      .def("release", &KvPool::release, py::arg("sequence"))
      .def("length", [](const KvPool& p, KvPool::Sequence s, const py::object& layer) {
             return layer.is_none() ? p.length(s) : p.length(s, layer.cast<std::int64_t>());
           }, py::arg("sequence"), py::arg("layer") = py::none())
      .def("block_table", [](const KvPool& p, KvPool::Sequence s) {
             const auto t = p.block_table(s);
             return std::vector<std::int32_t>(t.begin(), t.end());
           }, py::arg("sequence"))
      .def("keys", [](py::object self, std::int64_t layer) {
             const KvPool& p = self.cast<const KvPool&>();
             return cache_array(p, p.keys(layer), self);
           }, py::arg("layer") = 0, "Layer `layer`'s keys, [num_blocks, block_size, kv_heads, head_dim] (read-only view).")
      .def("values", [](py::object self, std::int64_t layer) {
             const KvPool& p = self.cast<const KvPool&>();
             return cache_array(p, p.values(layer), self);
           }, py::arg("layer") = 0)
      .def("key_scales", [](py::object self, std::int64_t layer) -> py::object {
             const KvPool& p = self.cast<const KvPool&>();
             const ConstTensorView v = p.key_scales(layer);
             if (v.empty()) return py::none();
             return cache_array(p, v, self)[py::make_tuple(py::ellipsis(), 0)];
           }, py::arg("layer") = 0,
           "8-bit pools: layer `layer`'s K row scales, float32 [num_blocks, block_size, kv_heads] (read-only); else None.")
      .def("value_scales", [](py::object self, std::int64_t layer) -> py::object {
             const KvPool& p = self.cast<const KvPool&>();
             const ConstTensorView v = p.value_scales(layer);
             if (v.empty()) return py::none();
             return cache_array(p, v, self)[py::make_tuple(py::ellipsis(), 0)];
           }, py::arg("layer") = 0)
      .def("__contains__", &KvPool::contains)
      .def_property_readonly("sequences", &KvPool::sequences)
      .def_property_readonly("num_blocks", &KvPool::num_blocks)
      .def_property_readonly("free_blocks", &KvPool::free_blocks)
      .def_property_readonly("block_size", &KvPool::block_size)
      .def_property_readonly("layers", &KvPool::layers)
      .def_property_readonly("bytes", &KvPool::bytes)
      .def_property_readonly("bytes_per_token", &KvPool::bytes_per_token,
                             "Bytes one token occupies per layer (an MLA layer's pool: its latent row)")
      .def_property_readonly("dtype", [](const KvPool& p) { return std::string(dtype_name(p.dtype())); });

  py::class_<PyPoolScheduler>(m, "PoolScheduler", R"doc(Continuous batching over a KvPool: request threads' prompts (cut into chunks of the token
budget) and decode steps run as batched forward_pool calls on the scheduler's own thread.)doc")
      .def(py::init([](const MultiHeadAttention& layer, KvPool& pool, std::int64_t token_budget, double max_wait_us,
                       std::int64_t layer_index, int threads, const std::string& backend) {
             PoolSchedulerOptions o;
             o.token_budget = token_budget;
             o.max_wait = std::chrono::microseconds(static_cast<std::int64_t>(max_wait_us));
             o.layer = layer_index, o.threads = threads, o.backend = backend_of(backend);
             return new PyPoolScheduler{layer, PoolScheduler(layer, pool, o)};
           }),
           py::arg("layer"), py::arg("pool"), py::kw_only(), py::arg("token_budget") = PoolSchedulerOptions{}.token_budget, py::arg("max_wait_us") = 500.0,
           py::arg("layer_index") = 0, py::arg("threads") = 0, py::arg("backend") = "native", py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def("open", [](PyPoolScheduler& s, const py::object& prefix) {
             return prefix.is_none() ? s.sched.open() : s.sched.open(prefix.cast<KvPool::Sequence>());
           }, py::arg("prefix") = py::none(), "A new sequence, empty or forked from `prefix`.")
      .def("close", [](PyPoolScheduler& s, KvPool::Sequence q) { s.sched.close(q); }, py::arg("sequence"))
      .def("step", [](PyPoolScheduler& s, KvPool::Sequence q, const py::object& x, const py::object& positions,
                      const py::object& tree_mask) { return scheduler_step_py(s.sched, s.layer, q, x, positions, tree_mask); },
           py::arg("sequence"), py::arg("query"), py::kw_only(), py::arg("positions") = py::none(),
           py::arg("tree_mask") = py::none(),
           R"doc(Runs query [T, d_model] (a prompt or a decode step) in batches with other threads' steps; returns its output.
tree_mask: a [T, T] bool draft tree (as forward_pool's tree_masks[i]), run whole in one batch.)doc")
      .def("accept", [](PyPoolScheduler& s, KvPool::Sequence seq, std::int64_t first, const py::object& kept) {
             const std::vector<std::int64_t> k = vector_of<std::int64_t>(kept, "kept");
             s.sched.accept(seq, first, k);
           }, py::arg("seq"), py::arg("first"), py::arg("kept"), "KvPool.accept on the scheduler's pool, between the sequence's steps.")
      .def("length", [](const PyPoolScheduler& s, KvPool::Sequence q) { return s.sched.length(q); }, py::arg("sequence"))
      .def_property_readonly("free_blocks", [](const PyPoolScheduler& s) { return s.sched.free_blocks(); })
      .def_property_readonly("batches", [](const PyPoolScheduler& s) { return s.sched.batches(); })
      .def_property_readonly("tokens_run", [](const PyPoolScheduler& s) { return s.sched.tokens_run(); });

  py::object cls = m.attr("MultiHeadAttention");
  cls.attr("forward_pool") = py::cpp_function(
      &forward_pool_py, py::name("forward_pool"), py::is_method(cls), py::arg("sequences"), py::arg("queries"),
      py::arg("pool"), py::arg("layer") = 0, py::kw_only(), py::arg("positions") = py::none(),
      py::arg("tree_masks") = py::none(), py::arg("threads") = 0, py::arg("backend") = "native",
      R"doc(One step of each sequence (queries[i] [T_i, d_model]: 1 = decode, more = a prompt chunk) over
the pool at layer `layer`: K/V appended, one batched attention call, outputs [T_i, d_model].
tree_masks: None, or per step None (causal) or a [T_i, T_i] bool array, a draft tree (token j
sees the sequence's earlier tokens and the step's tokens j' with mask[j, j']); positions then
give the tokens' RoPE positions (their depths).)doc");
}

}  // namespace simdattn::python
