// simdattn_serve_bench load (main.cpp has the mode's description).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve/serve.hpp"
#include "simdattn/simdattn.hpp"

namespace serve {
namespace {

// A request kind: run(client) performs one request on that client's state.
struct Server {
  std::string name;
  std::function<void(int)> run;
};

// Burns `iters` iterations of a dependent floating-point loop (the stand-in's work).
double burn(std::int64_t iters) {
  volatile double sink = 0;
  double x = 1.0;
  for (std::int64_t i = 0; i < iters; ++i) x = x * 1.0000001 + 1e-9;
  sink = x;
  return sink;
}

// Iterations of burn() per second on this thread, over ~50 ms.
double burn_rate() {
  std::int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    burn(iters);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.05) return static_cast<double>(iters) / s;
    iters *= 2;
  }
}

double percentile(std::vector<double>& v, double q) {  // nearest rank
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

// The client threads: started once and kept for every phase, as a service's request threads
// are (a library's per-thread state, its scratch and worker team, is made on a thread's first
// call, not per phase). run(job) runs job(c) on client c for every c and returns when all are
// done.
class Clients {
 public:
  explicit Clients(int n) {
    for (int c = 0; c < n; ++c)
      threads_.emplace_back([this, c] {
        std::size_t seen = 0;
        for (;;) {
          std::function<void(int)> job;
          {
            std::unique_lock<std::mutex> lock(m_);
            cv_.wait(lock, [&] { return generation_ != seen || quit_; });
            if (quit_) return;
            seen = generation_;
            job = job_;
          }
          job(c);
          std::lock_guard<std::mutex> lock(m_);
          if (--running_ == 0) done_.notify_all();
        }
      });
  }
  ~Clients() {
    {
      std::lock_guard<std::mutex> lock(m_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()); }
  void run(std::function<void(int)> job) {
    std::unique_lock<std::mutex> lock(m_);
    job_ = std::move(job);
    running_ = size();
    ++generation_;
    cv_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  std::function<void(int)> job_;
  std::size_t generation_ = 0;
  int running_ = 0;
  bool quit_ = false;
};

// Every client calling back to back for `seconds`: requests per second.
double saturation(Clients& clients, const Server& s, double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> done{0};
  const auto t0 = Clock::now();
  std::thread timer([&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
  });
  clients.run([&](int c) {
    std::int64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      s.run(c);
      ++n;
    }
    done += n;
  });
  timer.join();
  return static_cast<double>(done.load()) / std::chrono::duration<double>(Clock::now() - t0).count();
}

struct LoadResult {
  double offered, achieved, p50, p99, p999;  // requests/s; latencies in ms
  std::size_t requests;
  double svc_p50 = 0, svc_p99 = 0;  // the requests' own durations (from start to completion), ms
};

// The requests of one server at one load, gathered over its slices.
struct Samples {
  std::vector<double> lat, svc;  // latency from the scheduled arrival, service time (ms)
  double wall = 0;               // seconds
  LoadResult result(double rate) {
    LoadResult r{rate, static_cast<double>(lat.size()) / wall, 0, 0, 0, lat.size()};
    r.p50 = percentile(lat, 0.50), r.p99 = percentile(lat, 0.99), r.p999 = percentile(lat, 0.999);
    r.svc_p50 = percentile(svc, 0.50), r.svc_p99 = percentile(svc, 0.99);
    return r;
  }
};

// Open-loop Poisson arrivals at `rate` requests/s in total, split over the clients, for
// `seconds`: the requests' latencies added to `out`.
void open_loop(Clients& clients, const Server& s, double rate, double seconds, std::uint64_t seed, Samples& out) {
  const int C = clients.size();
  // Untimed: every client's requests back to back for a tenth of the slice's time (the steady
  // state is measured, not the switch from the previous server's work).
  {
    std::atomic<bool> stop{false};
    std::thread timer([&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds / 10));
      stop = true;
    });
    clients.run([&](int c) {
      while (!stop.load(std::memory_order_relaxed)) s.run(c);
    });
    timer.join();
  }
  std::vector<std::vector<double>> lat(static_cast<std::size_t>(C)), svc(lat);
  const auto start = Clock::now() + std::chrono::milliseconds(20);
  clients.run([&](int c) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(c));
    std::exponential_distribution<double> gap(rate / C);
    double t = gap(rng);  // seconds after start
    while (t < seconds) {
      const auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
      std::this_thread::sleep_until(due);
      const auto t0 = Clock::now();
      s.run(c);
      const auto t1 = Clock::now();
      lat[static_cast<std::size_t>(c)].push_back(std::chrono::duration<double, std::milli>(t1 - due).count());
      svc[static_cast<std::size_t>(c)].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      t += gap(rng);
    }
  });
  out.wall += std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& l : lat) out.lat.insert(out.lat.end(), l.begin(), l.end());
  for (auto& l : svc) out.svc.insert(out.svc.end(), l.begin(), l.end());
}

// The servers of a load run and what their requests read and write: the library (and, for
// decode, the scheduler) on `clients` clients' inputs, plus one more client's for `single`, one
// request at one thread (the stand-in's calibration). Not movable: the servers refer to it.
struct LoadServers {
  std::vector<Server> servers;
  std::function<void()> single;
  // bert: q, k, v [1, 12, 128, 64] per client (f32), default options.
  std::vector<std::vector<float>> q, k, v, o;
  // decode: the layer, each client's cache and token.
  std::unique_ptr<MultiHeadAttention> layer;
  std::vector<KvCache> caches;
  std::vector<std::vector<float>> tok, out;
  std::unique_ptr<DecodeScheduler> scheduler;

  explicit LoadServers(const Args& a);
  LoadServers(const LoadServers&) = delete;
  LoadServers& operator=(const LoadServers&) = delete;
};

LoadServers::LoadServers(const Args& a) {
  const int C = a.clients;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 1.f);
  if (a.workload == "bert") {
    const std::int64_t B = 1, H = 12, S = 128, D = 64, E = B * H * S * D;
    for (int c = 0; c <= C; ++c) {  // one more for the calibration
      auto fill = [&] {
        std::vector<float> x(static_cast<std::size_t>(E));
        for (auto& e : x) e = n(rng);
        return x;
      };
      q.push_back(fill()), k.push_back(fill()), v.push_back(fill()), o.emplace_back(static_cast<std::size_t>(E));
    }
    auto call = [this, B, H, S, D](int c, int threads) {
      AttentionOptions opt;
      opt.threads = threads;
      attention(ConstTensorView(q[c].data(), {B, H, S, D}), ConstTensorView(k[c].data(), {B, H, S, D}),
                ConstTensorView(v[c].data(), {B, H, S, D}), TensorView(o[c].data(), {B, H, S, D}), opt);
    };
    servers.push_back({"library", [call, t = a.threads](int c) { call(c, t); }});
    single = [call, C] { call(C, 1); };
  } else {
    layer = std::make_unique<MultiHeadAttention>(gpt_layer());
    const std::int64_t room = 16;  // caches stay within kv .. kv + 16 tokens
    for (int c = 0; c <= C; ++c) {
      caches.emplace_back(*layer, 1, a.kv + room);
      std::vector<float> prompt(static_cast<std::size_t>(a.kv * kD)), y(prompt.size());
      for (auto& e : prompt) e = n(rng);
      layer->forward(ConstSeqView(prompt.data(), 1, a.kv, kD), caches.back(), SeqView(y.data(), 1, a.kv, kD));
      tok.emplace_back(static_cast<std::size_t>(kD));
      for (auto& e : tok.back()) e = n(rng);
      out.emplace_back(static_cast<std::size_t>(kD));
    }
    scheduler = std::make_unique<DecodeScheduler>(*layer);
    // A step appends a token; after `room` steps the cache goes back to kv tokens, so every
    // step attends over kv .. kv + room tokens.
    auto step = [this, kv = a.kv, room](int c, int threads, bool batched) {
      KvCache& cache = caches[static_cast<std::size_t>(c)];
      if (cache.lengths()[0] >= kv + room) cache.truncate(0, kv);
      const ConstSeqView x(tok[c].data(), 1, 1, kD);
      const SeqView y(out[c].data(), 1, 1, kD);
      if (batched) scheduler->step({x, &cache, y});
      else {
        MhaOptions opt;
        opt.threads = threads;
        layer->forward(x, cache, y, opt);
      }
    };
    servers.push_back({"library", [step, t = a.threads](int c) { step(c, t, false); }});
    servers.push_back({"scheduler", [step](int c) { step(c, 0, true); }});
    single = [step, C] { step(C, 1, false); };
  }
}

// The stand-in's burn loop: iterations as long as one request at one thread (`work`, the median
// of 31 calls), refined against the call itself, interleaved (a drift of the machine's speed
// falls on both): twice, scaled by the ratio of the medians of 15 calls and 15 burns.
std::int64_t stand_in_iterations(const std::function<void()>& single, double& work) {
  for (int i = 0; i < 5; ++i) single();
  std::vector<double> t1;
  for (int i = 0; i < 31; ++i) {
    const auto t0 = Clock::now();
    single();
    t1.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  work = median(t1);
  auto iters = static_cast<std::int64_t>(work * burn_rate());
  for (int round = 0; round < 2; ++round) {
    std::vector<double> tc, tb;
    for (int i = 0; i < 15; ++i) {
      auto t0 = Clock::now();
      single();
      tc.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      t0 = Clock::now();
      burn(iters);
      tb.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    iters = static_cast<std::int64_t>(static_cast<double>(iters) * median(tc) / median(tb));
  }
  return iters;
}

// The run as JSON (docs/serving.md's chart reads it).
std::string load_json(const Args& a, const std::vector<Server>& servers, const std::vector<double>& sat,
                      const std::vector<std::vector<LoadResult>>& res, double work) {
  const int C = a.clients;
  std::ostringstream out_json;
  out_json << "{\"mode\": \"load\", \"workload\": \"" << a.workload << "\", \"kv\": " << a.kv << ", \"clients\": " << C
           << ", \"seconds\": " << a.seconds << ", \"slices\": " << a.slices << ", \"single_thread_ms\": " << work * 1e3 << ", \"servers\": [";
  for (std::size_t i = 0; i < servers.size(); ++i) {
    out_json << (i ? ", " : "") << "{\"name\": \"" << servers[i].name << "\", \"saturation\": " << sat[i]
             << ", \"points\": [";
    for (std::size_t j = 0; j < res[i].size(); ++j) {
      const LoadResult& r = res[i][j];
      out_json << (j ? ", " : "") << "{\"load_percent\": " << a.loads[j] << ", \"offered\": " << r.offered
               << ", \"achieved\": " << r.achieved << ", \"p50_ms\": " << r.p50 << ", \"p99_ms\": " << r.p99
               << ", \"p999_ms\": " << r.p999 << ", \"service_p50_ms\": " << r.svc_p50
               << ", \"service_p99_ms\": " << r.svc_p99 << ", \"requests\": " << r.requests << "}";
    }
    out_json << "]}";
  }
  out_json << "]}\n";
  return out_json.str();
}

}  // namespace

int load(const Args& a) {
  const int C = a.clients;
  LoadServers setup(a);
  std::vector<Server>& servers = setup.servers;
  double work = 0;
  const std::int64_t iters = stand_in_iterations(setup.single, work);
  servers.push_back({"stand-in", [iters](int) { burn(iters); }});

  std::printf("load: %s%s, %d clients, open-loop Poisson arrivals, %.1f s per point in %d slices; one request at 1 thread: %.3f ms\n",
              a.workload.c_str(), a.workload == "decode" ? (" (gpt-layer, kv " + std::to_string(a.kv) + ")").c_str() : "",
              C, a.seconds, a.slices, work * 1e3);
  Clients clients(C);
  for (const Server& s : servers)  // warm-up: every client's first requests
    clients.run([&](int c) {
      for (int i = 0; i < 20; ++i) s.run(c);
    });
  // Every measurement runs in a.slices slices of its time, the servers taking turns slice by
  // slice (the order reversed every other slice): the host's episodes of other work, which last
  // seconds on these VMs, then fall on every server alike rather than on whichever ran then.
  const double slice = a.seconds / a.slices;
  auto order = [&](int turn) {
    std::vector<std::size_t> seq(servers.size());
    for (std::size_t i = 0; i < seq.size(); ++i) seq[i] = turn % 2 == 0 ? i : seq.size() - 1 - i;
    return seq;
  };
  std::vector<double> sat(servers.size(), 0.0);
  for (int turn = 0; turn < a.slices; ++turn)
    for (std::size_t i : order(turn)) sat[i] += saturation(clients, servers[i], slice) / a.slices;
  const double base = sat.back();  // the stand-in's
  std::printf("%-10s %12s %12s %10s %10s %10s %10s\n", "server", "load", "achieved/s", "p50 ms", "p99 ms", "p999 ms", "requests");
  for (std::size_t i = 0; i < servers.size(); ++i) {
    std::printf("%-10s %12s %12.1f  (saturation; %.2fx the stand-in's)\n", servers[i].name.c_str(), "saturation", sat[i],
                sat[i] / base);
  }
  std::vector<std::vector<LoadResult>> res(servers.size());
  for (int pct : a.loads) {
    // Slice by slice, every server gets the same arrival times (the same generator and seed).
    const double rate = base * pct / 100.0;
    std::vector<Samples> got(servers.size());
    for (int turn = 0; turn < a.slices; ++turn)
      for (std::size_t i : order(turn))
        open_loop(clients, servers[i], rate, slice, 1000 * static_cast<std::uint64_t>(turn + 1) + static_cast<std::uint64_t>(pct),
                  got[i]);
    for (std::size_t i = 0; i < servers.size(); ++i) res[i].push_back(got[i].result(rate));
    for (std::size_t i = 0; i < servers.size(); ++i) {
      const LoadResult& r = res[i].back();
      std::printf("%-10s %11d%% %12.1f %10.3f %10.3f %10.3f %10zu   (service p50 %.3f, p99 %.3f)\n",
                  servers[i].name.c_str(), pct, r.achieved, r.p50, r.p99, r.p999, r.requests, r.svc_p50, r.svc_p99);
    }
  }
  // Library against the stand-in at each load.
  for (std::size_t i = 0; i + 1 < servers.size(); ++i)
    for (std::size_t j = 0; j < a.loads.size(); ++j)
      std::printf("%s / stand-in at %d%%: p50 %.2fx, p99 %.2fx\n", servers[i].name.c_str(), a.loads[j],
                  res[i][j].p50 / res.back()[j].p50, res[i][j].p99 / res.back()[j].p99);
  if (!a.json.empty()) std::ofstream(a.json) << load_json(a, servers, sat, res, work);
  return 0;
}
}  // namespace serve
