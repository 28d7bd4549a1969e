// simdattn_peak_memory: peak memory of one `long` attention call (B=1, H=8, S=8192, D=128,
// causal, 2 threads) beyond its inputs and output, from getrusage(RUSAGE_SELF).ru_maxrss.
#include "simdattn/bench.hpp"
#include "simdattn/simdattn.hpp"
#include <sys/resource.h>
#include <cstdio>
#include <vector>
static long rss_kb() { struct rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_maxrss; }
int main() {
  const simdattn::Workload* w = simdattn::find_workload("long");
  const size_t n = size_t(w->B * w->H * w->Sq * w->D);
  std::vector<float> q(n, 0.01f), k(n, 0.02f), v(n, 0.03f), o(n, 0.f);  // touched
  const long before = rss_kb();
  simdattn::AttentionOptions opt; opt.causal = w->causal; opt.threads = 2;
  simdattn::attention(simdattn::ConstTensorView(q.data(), {w->B, w->H, w->Sq, w->D}), simdattn::ConstTensorView(k.data(), {w->B, w->Hkv, w->Sk, w->D}),
                      simdattn::ConstTensorView(v.data(), {w->B, w->Hkv, w->Sk, w->D}), simdattn::TensorView(o.data(), {w->B, w->H, w->Sq, w->D}), opt);
  const long after = rss_kb();
  std::printf("inputs+output %.1f MiB; peak RSS before call %.1f MiB, after %.1f MiB: +%.1f MiB for the call\n",
              4.0 * n * 4 / 1048576.0, before / 1024.0, after / 1024.0, (after - before) / 1024.0);
}
