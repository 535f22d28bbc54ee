#include "e2e/bench_e2e.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "cuda/bandwidth.h"
#include "cuda/device.h"
#include "engine/backend.h"
#include "loader/checkpoint.h"
#include "loader/weight_map.h"
#include "model/deepseek_v4.h"
#if DSV4_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace dsv4 {

std::string decode_output(const BenchOptions& o) {
  if (o.download_logits) return "logits of every sequence downloaded";
  if (o.temperature > 0.0f) {
    std::ostringstream t;
    t << "the next tokens drawn at temperature " << o.temperature << " on the backend (ids downloaded)";
    return t.str();
  }
  return "the greedy next tokens chosen on the backend (ids downloaded)";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }


// ---- memory

// "VmRSS" / "VmHWM" of this process in bytes, from /proc/self/status.
double proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + key.size()) * 1024.0;  // "VmRSS:  1234 kB"
  return 0;
}

// Memory in use: on the GPU (all processes, cudaMemGetInfo) for the CUDA backend, else this process's RSS.
class MemoryProbe {
 public:
  explicit MemoryProbe(bool gpu) : gpu_(gpu) {}
  const char* kind() const { return gpu_ ? "GPU" : "RSS"; }
  double sample() {
    double now = 0;
    if (gpu_) {
      size_t used = 0, total = 0;
      if (device_memory_used(&used, &total)) now = double(used);
      peak_ = std::max(peak_, now);
    } else {
      now = proc_status_bytes("VmRSS");
      peak_ = std::max({peak_, now, proc_status_bytes("VmHWM")});
    }
    return now;
  }
  double peak() const { return peak_; }

 private:
  bool gpu_;
  double peak_ = 0;
};

// ---- bandwidth

// Bytes/s (read + written) of a multithreaded memcpy of 256 MiB, best of 5 after the buffers are touched.
double measure_memcpy_bandwidth() {
  constexpr size_t kBytes = size_t(256) << 20;
  std::vector<uint8_t> src(kBytes, 1), dst(kBytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel
    {
      const size_t threads = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t begin = kBytes * t / threads, end = kBytes * (t + 1) / threads;
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    }
    if (rep > 0) best = std::min(best, seconds_since(t0));  // rep 0 warms up
  }
  return 2.0 * double(kBytes) / best;
}

// ---- device description

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "CPU";
}

std::string device_description(const std::string& backend) {
  if (backend == "cuda") {
    std::string why;
    const auto devices = cuda_devices(&why);
    if (devices.empty()) return "no GPU (" + why + ")";
    const CudaDevice& d = devices.front();
    return cat(d.name, " (sm_", d.sm_major, d.sm_minor, ", ", d.multiprocessors, " SMs, ",
               std::round(double(d.memory_bytes) / double(1ull << 30) * 10) / 10, " GiB)");
  }
  return cat(cpu_name(), ", ", omp_get_max_threads(), " threads");
}

// ---- weight sizes

// Bytes of a matrix as `ops` holds it: the CUDA backend's upload (cuda/common/device_weight.h) widens some
// formats (F16 → F32, FP8 block scales → F32); the CPU backend uses the checkpoint bytes.
std::function<double(const Weight&)> resident_bytes(Ops& ops) {
#if DSV4_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaOps*>(&ops)) {
    return [cuda](const Weight& w) {
      if (w.empty()) return 0.0;
      const cuda::DeviceWeight& d = cuda->dev(w);
      double bytes = double(d.rows) * double(d.row_bytes());
      if (d.scale_f32) bytes += double((d.rows + 127) / 128) * double(d.scale_cols) * 4.0;
      if (d.scale_e8m0) bytes += double(d.rows) * double(d.scale_cols);
      return bytes;
    };
  }
#endif
  (void)ops;
  return stored_bytes;
}

// Every matrix of a layer that a decode step reads whatever the routing: mHC, attention, compressors, indexer,
// router and shared expert.
double dense_layer_bytes(const LayerWeights& l, const std::function<double(const Weight&)>& bytes) {
  const AttentionWeights& a = l.attn;
  double sum = 0;
  for (const Weight* w : {&l.hc_attn.fn, &l.hc_ffn.fn, &a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.compressor.wkv,
                          &a.compressor.wgate, &a.indexer.wq_b, &a.indexer.weights_proj, &a.indexer.compressor.wkv,
                          &a.indexer.compressor.wgate, &l.moe.gate, &l.moe.shared.w1, &l.moe.shared.w2,
                          &l.moe.shared.w3})
    sum += bytes(*w);
  return sum;
}

double expert_bytes(const ExpertWeights& e, const std::function<double(const Weight&)>& bytes) {
  return bytes(e.w1) + bytes(e.w2) + bytes(e.w3);
}

// Cache bytes one sequence reads in one layer for a new token at `position` (position + 1 keys visible). Rows
// are fp32, or compact (model/ops.h CacheFormat, without row padding): a KV row is its e4m3 non-rope channels,
// one E8M0 scale per 64 and fp32 rope channels; an indexer key is e2m1 pairs and one E8M0 scale per 32.
double layer_cache_bytes(const ModelConfig& c, AttnType type, double position, bool compact) {
  const double visible = position + 1, nope = double(c.head_dim - c.rope_dim);
  const double kv_row = compact ? nope + std::ceil(nope / 64) + 4.0 * double(c.rope_dim) : 4.0 * double(c.head_dim);
  const double key_row = compact ? double(c.index_head_dim) / 2 + double(c.index_head_dim) / 32
                                 : 4.0 * double(c.index_head_dim);
  double bytes = std::min(visible, double(c.window)) * kv_row;  // the window ring
  if (type == AttnType::kCsa) {
    const double entries = std::floor(visible / 4);
    bytes += std::min(entries, double(c.index_topk)) * kv_row;  // the top-k compressed entries
    bytes += entries * key_row;                                 // every indexer key is scored
  } else if (type == AttnType::kHca) {
    bytes += std::floor(visible / 128) * kv_row;  // every compressed entry
  }
  return bytes;
}

// ---- sequences

// Waits for the backend's queued work (download is the Ops seam's synchronising call): rank 0's, which the
// other ranks' all-reduces keep in step with them.
void sync(const Ranks& ranks, const SequenceState& s) {
  float dummy;
  ranks.ops().download(&dummy, s.ranks.front().layers.front().window, 1);
}

// Feeds tokens to one sequence in steps of at most max_step; logits (host, [V]) of the last token if asked.
void feed(DeepseekV4& model, SequenceState& seq, const int32_t* tokens, int64_t n, float* logits) {
  for (int64_t done = 0; done < n;) {
    const int64_t len = std::min(model.max_step(), n - done);
    const bool last = done + len == n;
    const StepInput in{&seq, tokens + done, len, last ? logits : nullptr, false};
    model.step(std::span<const StepInput>(&in, 1));
    done += len;
  }
}

void check_list(const std::vector<int64_t>& v, const char* what, int64_t min) {
  DSV4_CHECK(!v.empty(), "--", what, ": give at least one value");
  for (int64_t x : v) DSV4_CHECK(x >= min, "--", what, ": ", x, " is below ", min);
}

void measure_bandwidth(BenchReport& r) {
  const bool gpu = r.backend == "cuda";
  r.bandwidth = gpu ? measure_copy_bandwidth() : measure_memcpy_bandwidth();
  r.bandwidth_method = gpu ? "cudaMemcpy device to device, 2 GiB, best of 5, read + written bytes"
                           : "memcpy 256 MiB on all threads, best of 5, read + written bytes";
  if (r.options.log) r.options.log(cat("copy bandwidth ", std::round(r.bandwidth / 1e8) / 10, " GB/s"));
}

std::string format_stat(const Stat& s, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f ± %.*f", decimals, s.mean, decimals, s.sd);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

}  // namespace

Stat stat_of(const std::vector<double>& x) {
  Stat s;
  if (x.empty()) return s;
  s.min = s.max = x.front();
  for (double v : x) {
    s.mean += v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  s.mean /= double(x.size());
  if (x.size() > 1) {
    double ss = 0;
    for (double v : x) ss += (v - s.mean) * (v - s.mean);
    s.sd = std::sqrt(ss / double(x.size() - 1));
  }
  return s;
}

double expected_distinct_experts(int64_t experts, int64_t k, int64_t batch) {
  const double E = double(experts);
  return E * (1.0 - std::pow(1.0 - double(k) / E, double(batch)));
}

DecodeFloor decode_floor(const ModelWeights& model, const std::function<double(const Weight&)>& weight_bytes,
                         int64_t batch, double position, double bandwidth, bool compact_cache) {
  const ModelConfig& c = model.config;
  DecodeFloor f;
  f.experts_per_layer = expected_distinct_experts(c.n_routed_experts, c.n_experts_per_tok, batch);
  // The embedding rows of the batch, the final mHC collapse and the LM head.
  f.weight_bytes = weight_bytes(model.embed) / double(c.vocab_size) * double(std::min<int64_t>(batch, c.vocab_size));
  f.weight_bytes += weight_bytes(model.hc_head.fn) + weight_bytes(model.head);
  for (const LayerWeights& l : model.layers) {
    f.weight_bytes += dense_layer_bytes(l, weight_bytes) + f.experts_per_layer * expert_bytes(l.moe.experts.front(), weight_bytes);
    f.cache_bytes += double(batch) * layer_cache_bytes(c, l.attn_type, position, compact_cache);
  }
  f.seconds = bandwidth > 0 ? (f.weight_bytes + f.cache_bytes) / bandwidth : 0;
  return f;
}

BenchReport run_bench(const BenchOptions& o) {
  check_list(o.prefill, "prefill", 1);
  check_list(o.contexts, "contexts", 0);
  check_list(o.batches, "batches", 1);
  DSV4_CHECK(o.reps >= 1, "--reps must be at least 1");
  DSV4_CHECK(o.decode_steps >= 1, "--decode-steps must be at least 1");
  DSV4_CHECK(o.step >= 1, "--step must be at least 1");
  const auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };

  BenchReport r;
  r.options = o;
  r.model_dir = o.model_dir;
  r.backend = resolve_backend_name(o.backend);
  r.numerics = numerics_name(o.numerics);
  r.device = device_description(r.backend);
  const bool gpu = r.backend == "cuda";
  // Backend problems surface before anything is measured or loaded (make_backend would say the same, later).
  DSV4_CHECK(gpu || r.backend == "cpu", "unknown backend '", o.backend, "' (available: auto, cpu",
             cuda_compiled() ? ", cuda" : "", ")");
  std::string why;
  DSV4_CHECK(!gpu || !cuda_devices(&why).empty(), "--backend cuda: no usable GPU (", why, ")");
  // The GPU copy needs 4 GiB of free device memory: before the model is loaded. The CPU copy runs last, so
  // its buffers stay out of the memory peak.
  if (gpu) measure_bandwidth(r);

  MemoryProbe memory(gpu);
  r.memory_kind = memory.kind();
  r.memory_before_load = memory.sample();
  const auto t_load = Clock::now();
  const std::unique_ptr<const ModelWeights> weights = o.load ? o.load() : load_model(o.model_dir);
  const ModelConfig& c = weights->config;
  r.layers = c.n_layers;
  r.dim = c.dim;
  r.experts = c.n_routed_experts;
  r.experts_per_tok = c.n_experts_per_tok;
  r.vocab = c.vocab_size;
  const int64_t max_prefill = *std::max_element(o.prefill.begin(), o.prefill.end());
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  std::vector<int64_t> contexts = o.contexts;
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  // Every repetition forks the prefilled context and decodes decode_steps tokens past it.
  const int64_t decode_context = contexts.back() + o.decode_steps;
  if (c.max_position_embeddings > 0)
    DSV4_CHECK(std::max(max_prefill, decode_context) <= c.max_position_embeddings, "the benchmark reaches ",
               std::max(max_prefill, decode_context), " tokens, beyond the model's context of ",
               c.max_position_embeddings);
  weights->storage->prefetch([](size_t, size_t) {});  // no page faults inside timed steps
  const Ranks ranks = make_ranks(o.backend, *weights, o.parallelism);
  // The model's own default sequence is not used: the smallest one.
  DeepseekV4 model(*weights, ranks.shards, o.numerics, /*max_context=*/1, std::max(o.step, max_batch));
  r.load_seconds = seconds_since(t_load);
  r.step_tokens = model.max_step();
  r.memory_after_load = memory.sample();
  // Several ranks: the checkpoint's bytes (each backend holds only its shard's).
  const std::function<double(const Weight&)> weight_bytes =
      o.parallelism.ranks() > 1 ? stored_bytes : resident_bytes(ranks.ops());
  for (const Weight* w : weights->matrices)
    if (w) r.weight_bytes += weight_bytes(*w);
  log(cat("loaded ", o.model_dir, " in ", std::round(r.load_seconds * 10) / 10, " s: ", gib(r.weight_bytes),
          " of weights on ", r.backend));

  std::mt19937_64 rng(o.seed);
  const auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint64_t(c.vocab_size));
    return t;
  };
  std::vector<float> logits(size_t(max_batch * c.vocab_size));

  // ---- prefill: one sequence, reset before every repetition; the first run of each length is a warm-up.
  {
    auto seq = model.new_sequence(max_prefill);
    for (int64_t P : o.prefill) {
      const std::vector<int32_t> tokens = random_tokens(P);
      std::vector<double> ms, tps;
      for (int64_t rep = -1; rep < o.reps; ++rep) {
        model.reset(*seq);
        sync(ranks, *seq);
        const auto t0 = Clock::now();
        feed(model, *seq, tokens.data(), P, logits.data());  // the last step's logits download synchronises
        const double s = seconds_since(t0);
        if (rep < 0) continue;
        ms.push_back(s * 1e3);
        tps.push_back(double(P) / s);
      }
      r.prefill.push_back({P, stat_of(ms), stat_of(tps)});
      memory.sample();
      log(cat("prefill ", P, ": ", format_stat(r.prefill.back().tokens_per_s, 1), " tokens/s"));
    }
  }

  // ---- decode: a master sequence is prefilled to each context in turn (contexts ascending, so each prefill
  // extends the last); every repetition forks it into `batch` sequences and times decode_steps steps of one
  // new token per sequence (random ids, so that the routing spreads as real text does), each step ending with
  // the greedy next tokens chosen on the backend, tokens drawn there (--temperature), or all logits downloaded
  // (--logits).
  auto master = model.new_sequence(std::max<int64_t>(contexts.back(), 1));
  model.reset(*master);
  std::vector<std::unique_ptr<SequenceState>> pool;
  for (int64_t i = 0; i < max_batch; ++i) pool.push_back(model.new_sequence(decode_context));
  const std::vector<int32_t> context_tokens = random_tokens(contexts.back());
  for (int64_t C : contexts) {
    if (C > master->position)
      feed(model, *master, context_tokens.data() + master->position, C - master->position, nullptr);
    for (int64_t b : o.batches) {
      std::vector<StepInput> batch(static_cast<size_t>(b));
      std::vector<int32_t> tokens(static_cast<size_t>(b)), next(static_cast<size_t>(b));
      std::vector<RowDraw> draws(static_cast<size_t>(b));
      const auto run = [&](int64_t steps) {
        for (int64_t i = 0; i < b; ++i) model.copy_sequence(*master, *pool[size_t(i)]);
        sync(ranks, *master);
        const auto t0 = Clock::now();
        for (int64_t s = 0; s < steps; ++s) {
          for (int64_t i = 0; i < b; ++i) {
            tokens[size_t(i)] = int32_t(rng() % uint64_t(c.vocab_size));
            draws[size_t(i)] = {.temperature = o.temperature, .seed = uint64_t(i), .step = uint64_t(s)};
            batch[size_t(i)] = o.download_logits
                                   ? StepInput{pool[size_t(i)].get(), &tokens[size_t(i)], 1,
                                               logits.data() + i * c.vocab_size, false}
                                   : StepInput{pool[size_t(i)].get(), &tokens[size_t(i)], 1, nullptr, false,
                                               &next[size_t(i)], &draws[size_t(i)]};
          }
          model.step(batch);
        }
        return seconds_since(t0) / double(steps);
      };
      run(1);  // warm-up: workspaces reach this batch's size
      std::vector<double> ms, tps;
      for (int64_t rep = 0; rep < o.reps; ++rep) {
        const double s = run(o.decode_steps);
        ms.push_back(s * 1e3);
        tps.push_back(double(b) / s);
      }
      DecodeRow row;
      row.context = C;
      row.batch = b;
      row.ms_per_step = stat_of(ms);
      row.tokens_per_s = stat_of(tps);
      r.decode.push_back(row);
      memory.sample();
      log(cat("decode context ", C, " batch ", b, ": ", format_stat(row.ms_per_step, 3), " ms/step"));
    }
  }
  r.memory_peak = memory.peak();
  if (!gpu) measure_bandwidth(r);
  // GPU ranks each read their share over their own memory: the floor is the bytes over all their bandwidths.
  const double floor_bandwidth = r.bandwidth * (gpu ? o.parallelism.ranks() : 1);
  for (DecodeRow& row : r.decode) {
    // The timed steps decode positions C .. C + steps − 1: the floor at their mean.
    row.floor = decode_floor(*weights, weight_bytes, row.batch, double(row.context) + double(o.decode_steps - 1) / 2,
                             floor_bandwidth, /*compact_cache=*/gpu && o.numerics != Numerics::kExact);
    row.achieved = row.floor.seconds * 1e3 / row.ms_per_step.mean;
  }
  return r;
}

std::string bench_markdown(const BenchReport& r) {
  std::ostringstream out;
  char line[512];
  out << "## dsv4 bench: " << r.model_dir << "\n\n";
  out << "* model: " << r.layers << " layers, D " << r.dim << ", " << r.experts << " experts (top-" << r.experts_per_tok
      << "), vocab " << r.vocab << ", " << gib(r.weight_bytes) << " of weights as held by the backend\n";
  out << "* backend: " << r.backend << " on " << r.device << ", numerics " << r.numerics << ", "
      << parallelism_name(r.options.parallelism) << "\n";
  std::snprintf(line, sizeof line, "* copy bandwidth: %.1f GB/s (%s)\n", r.bandwidth / 1e9, r.bandwidth_method.c_str());
  out << line;
  out << "* memory (" << r.memory_kind << "): " << gib(r.memory_before_load) << " before load, "
      << gib(r.memory_after_load) << " after load, " << gib(r.memory_peak) << " peak; load "
      << std::round(r.load_seconds * 10) / 10 << " s\n";
  if (!r.synth.is_null() && r.synth.value("in_memory", false)) {
    std::snprintf(line, sizeof line,
                  "* synthesised for this run in memory: %.2f GiB, of which %.2f GiB made on the host (%.1f s), "
                  "the rest in place on the device during the load\n",
                  r.synth.value("bytes", 0.0) / double(1ull << 30), r.synth.value("host_bytes", 0.0) / double(1ull << 30),
                  r.synth.value("seconds", 0.0));
    out << line;
  } else if (!r.synth.is_null()) {
    std::snprintf(line, sizeof line, "* synthesised for this run: %.2f GiB in %.1f s (%.2f GB/s)\n",
                  r.synth.value("bytes", 0.0) / double(1ull << 30), r.synth.value("seconds", 0.0),
                  r.synth.value("bytes", 0.0) / std::max(r.synth.value("seconds", 0.0), 1e-9) / 1e9);
    out << line;
  }
  out << "* " << r.options.reps << " repetitions (mean ± sd); decode: " << r.options.decode_steps
      << " steps per repetition, one new token per sequence per step, "
      << decode_output(r.options) << "\n\n";

  out << "| prefill tokens | step | ms | tokens/s |\n|---:|---:|---:|---:|\n";
  for (const PrefillRow& p : r.prefill)
    out << "| " << p.tokens << " | " << std::min(p.tokens, r.step_tokens) << " | "
        << format_stat(p.ms, 2) << " | " << format_stat(p.tokens_per_s, 1) << " |\n";

  out << "\n| context | batch | ms/step (latency) | tokens/s | experts/layer | floor GB (weights + cache) | floor ms "
         "| of floor |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const DecodeRow& d : r.decode) {
    std::snprintf(line, sizeof line, "| %lld | %lld | %s | %s | %.1f | %.3f (%.3f + %.3f) | %.3f | %.1f%% |\n",
                  (long long)d.context, (long long)d.batch, format_stat(d.ms_per_step, 3).c_str(),
                  format_stat(d.tokens_per_s, 1).c_str(), d.floor.experts_per_layer,
                  (d.floor.weight_bytes + d.floor.cache_bytes) / 1e9, d.floor.weight_bytes / 1e9,
                  d.floor.cache_bytes / 1e9, d.floor.seconds * 1e3, d.achieved * 100);
    out << line;
  }
  out << "\nfloor = (every dense matrix + E·(1−(1−k/E)^batch) routed experts per layer + embedding rows + head, "
         "as the backend stores them; + per sequence and layer the window keys, the CSA top-k entries and indexer "
         "keys, the HCA entries, as the backend stores them: compact FP8 / FP4 rows on CUDA outside exact numerics, "
         "else fp32) / copy bandwidth"
      << (r.backend == "cuda" && r.options.parallelism.ranks() > 1
              ? cat(" of one GPU × ", r.options.parallelism.ranks(), " GPUs (checkpoint bytes, each counted once)")
              : std::string())
      << "\n";
  return out.str();
}

nlohmann::json bench_json(const BenchReport& r) {
  using nlohmann::json;
  const auto stat = [](const Stat& s) { return json{{"mean", s.mean}, {"sd", s.sd}, {"min", s.min}, {"max", s.max}}; };
  json j;
  j["model"] = {{"dir", r.model_dir},        {"layers", r.layers},          {"hidden_size", r.dim},
                {"experts", r.experts},      {"experts_per_tok", r.experts_per_tok}, {"vocab_size", r.vocab},
                {"weight_bytes", r.weight_bytes}};
  j["backend"] = r.backend;
  j["device"] = r.device;
  j["numerics"] = r.numerics;
  j["bandwidth"] = {{"bytes_per_s", r.bandwidth}, {"method", r.bandwidth_method}};
  j["parallelism"] = {{"tp", r.options.parallelism.tp}, {"ep", r.options.parallelism.ep}};
  j["memory"] = {{"kind", r.memory_kind},
                 {"before_load_bytes", r.memory_before_load},
                 {"after_load_bytes", r.memory_after_load},
                 {"peak_bytes", r.memory_peak}};
  j["load_seconds"] = r.load_seconds;
  j["options"] = {{"reps", r.options.reps}, {"decode_steps", r.options.decode_steps}, {"step", r.step_tokens},
                  {"seed", r.options.seed}, {"decode_output", decode_output(r.options)}};
  if (!r.synth.is_null()) j["synth"] = r.synth;
  j["prefill"] = json::array();
  for (const PrefillRow& p : r.prefill)
    j["prefill"].push_back({{"tokens", p.tokens}, {"ms", stat(p.ms)}, {"tokens_per_s", stat(p.tokens_per_s)}});
  j["decode"] = json::array();
  for (const DecodeRow& d : r.decode)
    j["decode"].push_back({{"context", d.context},
                           {"batch", d.batch},
                           {"ms_per_step", stat(d.ms_per_step)},
                           {"tokens_per_s", stat(d.tokens_per_s)},
                           {"floor",
                            {{"weight_bytes", d.floor.weight_bytes},
                             {"cache_bytes", d.floor.cache_bytes},
                             {"experts_per_layer", d.floor.experts_per_layer},
                             {"ms", d.floor.seconds * 1e3}}},
                           {"achieved", d.achieved}});
  return j;
}

}  // namespace dsv4
