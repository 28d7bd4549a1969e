// simdattn_peak_memory [t5]: peak memory of one `long` attention call (B=1, H=8, S=8192, D=128,
// causal, 2 threads) beyond its inputs and output, from getrusage(RUSAGE_SELF).ru_maxrss; with
// `t5`, with T5's relative position bias (32 buckets, one-way, max distance 128) on top.
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"
#include <sys/resource.h>
#include <cstdio>
#include <vector>
static long rss_kb() { struct rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_maxrss; }
#include <cstring>
int main(int argc, char** argv) {
  const bool t5 = argc > 1 && std::strcmp(argv[1], "t5") == 0;
  const simdattn::Workload* w = simdattn::find_workload("long");
  const size_t n = size_t(w->B * w->H * w->Sq * w->D);
  std::vector<float> q(n, 0.01f), k(n, 0.02f), v(n, 0.03f), o(n, 0.f);  // touched
  std::vector<float> table(size_t(32 * w->H), 0.1f);
  const long before = rss_kb();
  simdattn::AttentionOptions opt; opt.causal = w->causal; opt.threads = 2;
  if (t5) opt.relative_bias = simdattn::RelativePositionBias{simdattn::ConstTensorView(table.data(), {1, 1, 32, w->H}), false, 128};
  simdattn::attention(simdattn::ConstTensorView(q.data(), {w->B, w->H, w->Sq, w->D}), simdattn::ConstTensorView(k.data(), {w->B, w->Hkv, w->Sk, w->D}),
                      simdattn::ConstTensorView(v.data(), {w->B, w->Hkv, w->Sk, w->D}), simdattn::TensorView(o.data(), {w->B, w->H, w->Sq, w->D}), opt);
  const long after = rss_kb();
  std::printf("%sinputs+output %.1f MiB; peak RSS before call %.1f MiB, after %.1f MiB: +%.1f MiB for the call\n",
              t5 ? "with T5's bias: " : "", 4.0 * n * 4 / 1048576.0, before / 1024.0, after / 1024.0, (after - before) / 1024.0);
}
