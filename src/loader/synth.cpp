#include "loader/synth.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "loader/checkpoint.h"
#include "loader/hf_config.h"
#include "loader/quantize.h"
#include "loader/safetensors.h"
#include "loader/synth_fill.h"
#include "loader/weight_map.h"

namespace dsv4 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Standard normal quantile by bisection on erfc: only used to build tables, once.
double normal_quantile(double u) {
  double lo = -12.0, hi = 12.0;
  for (int i = 0; i < 64; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < u) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

// 16 random bits → a standard normal sample: the 65536 mid-quantiles (tails to ±4.3σ).
const std::vector<float>& normal_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(kSynthTableEntries);
    for (size_t i = 0; i < 32768; ++i) {
      t[i] = float(normal_quantile((double(i) + 0.5) / 65536.0));
      t[65535 - i] = -t[i];
    }
    return t;
  }();
  return table;
}

// The value tables of synth_fill.h: 16 random bits → one stored entry.
enum class Values : uint8_t { kNormal, kUniform, kCodes, kConstant };

std::vector<uint8_t> value_table(Values kind, DType dtype, WeightFormat format, double a, double b) {
  const std::vector<float>& z = normal_table();
  std::vector<uint8_t> t;
  const auto put = [&](size_t i, const void* v, size_t n) { std::memcpy(t.data() + i * n, v, n); };
  switch (kind) {
    case Values::kConstant:  // every byte = a (E8M0 scales)
      t.assign(kSynthTableEntries, uint8_t(a));
      break;
    case Values::kCodes:  // N(0, b) rounded by the format's conversion: an e4m3 code, or two e2m1 codes packed
      t.resize(kSynthTableEntries);
      if (format == WeightFormat::kFp8Block) {
        for (size_t i = 0; i < t.size(); ++i) t[i] = f32_to_e4m3(float(b * z[i]));
      } else {  // low nibble first
        std::array<uint8_t, 256> nibble{};
        for (size_t i = 0; i < 256; ++i) nibble[i] = f32_to_e2m1(float(b * normal_quantile((double(i) + 0.5) / 256.0)));
        for (size_t i = 0; i < t.size(); ++i) t[i] = uint8_t(nibble[i & 255] | (nibble[i >> 8] << 4));
      }
      break;
    case Values::kNormal:  // mean a, std b; or uniform on [a, b)
    case Values::kUniform:
      t.resize(size_t(kSynthTableEntries) * dtype_size(dtype));
      for (size_t i = 0; i < size_t(kSynthTableEntries); ++i) {
        const float fa = float(a), fb = float(b);
        const float v = kind == Values::kNormal ? fa + fb * z[i] : fa + (fb - fa) * (float(i) + 0.5f) / 65536.0f;
        if (dtype == DType::kBF16) {
          const uint16_t h = f32_to_bf16(v);
          put(i, &h, 2);
        } else {
          DSV4_ASSERT(dtype == DType::kF32);
          put(i, &v, 4);
        }
      }
      break;
  }
  return t;
}

// ---- the tensors of a config and how each is filled

// The value tables the plans point into, made once per distinct distribution.
class Tables {
 public:
  const void* get(Values kind, DType dtype, WeightFormat format, double a, double b) {
    auto& slot = tables_[{int(kind), int(dtype), int(format), a, b}];
    if (!slot) slot = std::make_unique<std::vector<uint8_t>>(value_table(kind, dtype, format, a, b));
    return slot->data();
  }

 private:
  std::map<std::tuple<int, int, int, double, double>, std::unique_ptr<std::vector<uint8_t>>> tables_;
};

struct TensorPlan {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  SynthFill fill;                // bytes as synth_fill.h makes them, or
  int64_t expert_table = 0;      // > 0: tid2eid, rows of k distinct experts in [0, expert_table)
  // May be made on the device (SynthPlace::kDevice): a matrix's elements and the FP4 scales, which the CUDA
  // backend keeps as stored; FP8 block scales stay on the host, which converts them to F32.
  bool device_made = false;
  size_t nbytes = 0;
  size_t offset = 0;  // in the shard's data section
};

struct Shard {
  std::string file;
  std::vector<TensorPlan> tensors;
  size_t header_bytes = 0;  // 8-byte length + JSON, padded to 8
  size_t bytes = 0;
  std::string header;
};

class Planner {
 public:
  Planner(const ModelConfig& c, uint64_t seed, Tables* tables)
      : c_(c), seed_(splitmix64_mix(seed ^ 0xD5E4ull)), tables_(*tables) {}

  std::vector<Shard> plan(bool mtp) {
    begin_shard();
    // Unit-scale residual streams; logits ≈ N(0, 1) after the final norm: varied, never saturated.
    normal("embed.weight", {c_.vocab_size, c_.dim}, 0.0f, 1.0f);
    normal("head.weight", {c_.vocab_size, c_.dim}, 0.0f, float(1.0 / std::sqrt(double(c_.dim))));
    norm("norm.weight", c_.dim);
    hc_head("hc_head");
    for (int64_t i = 0; i < c_.n_layers; ++i) {
      begin_shard();
      layer(cat("layers.", i, "."), i, c_.is_hash_layer(i));
    }
    if (mtp && c_.n_mtp_layers > 0) {
      begin_shard();
      const int64_t D = c_.dim;
      matrix("mtp.0.e_proj.weight", D, D);
      matrix("mtp.0.h_proj.weight", D, D);
      for (const char* n : {"enorm", "hnorm", "norm"}) norm(cat("mtp.0.", n, ".weight"), D);
      hc_head("mtp.0.hc_head");
      layer("mtp.0.", c_.n_layers, /*hash=*/false);
    }
    return std::move(shards_);
  }

 private:
  void begin_shard() { shards_.emplace_back(); }

  TensorPlan& add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    TensorPlan t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= size_t(d);
    t.nbytes = numel * dtype_size(dtype);
    t.fill.key = splitmix64_mix(seed_ ^ fnv1a(name));
    shards_.back().tensors.push_back(std::move(t));
    return shards_.back().tensors.back();
  }
  TensorPlan& add(const std::string& name, DType dtype, std::vector<int64_t> shape, Values kind, double a, double b,
                  WeightFormat format = WeightFormat::kKeep) {
    TensorPlan& t = add(name, dtype, std::move(shape));
    t.fill.table = tables_.get(kind, dtype, format, a, b);
    t.fill.entry_bytes = kind == Values::kCodes || kind == Values::kConstant ? 1 : int(dtype_size(dtype));
    return t;
  }

  void normal(const std::string& name, std::vector<int64_t> shape, float mean, float std,
              DType dtype = DType::kBF16) {
    const bool matrix = shape.size() == 2 && dtype == DType::kBF16;
    add(name, dtype, std::move(shape), Values::kNormal, mean, std).device_made = matrix;
  }
  void uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    add(name, DType::kF32, std::move(shape), Values::kUniform, lo, hi);
  }
  void norm(const std::string& name, int64_t n) { normal(name, {n}, 1.0f, 0.1f); }  // gains ≈ 1, as trained ones

  // A linear layer [rows, cols] with std 1/sqrt(cols) in real units, in the official format of its name. The
  // E8M0 scale is the one DeepSeek's converter picks for such a Gaussian, 2^ceil(log2(amax / max_code)) with
  // the typical block maximum (≈ 4σ over 128×128 values, ≈ 2.5σ over 32); the codes are N(0, std / scale)
  // rounded to the format.
  void matrix(const std::string& name, int64_t rows, int64_t cols) {
    const double std = 1.0 / std::sqrt(double(cols));
    const WeightFormat format = official_format(name);
    if (format == WeightFormat::kKeep) {
      normal(name, {rows, cols}, 0.0f, float(std));
      return;
    }
    const bool fp8 = format == WeightFormat::kFp8Block;
    const int e = int(std::ceil(std::log2(std * (fp8 ? 4.0 : 2.5) / (fp8 ? 448.0 : 6.0))));
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    add(name, fp8 ? DType::kF8E4M3 : DType::kI8, {rows, fp8 ? cols : cols / 2}, Values::kCodes, 0.0,
        std::ldexp(std, -e), format)
        .device_made = true;
    add(base + ".scale", DType::kF8E8M0,
        fp8 ? std::vector<int64_t>{(rows + 127) / 128, (cols + 127) / 128} : std::vector<int64_t>{rows, cols / 32},
        Values::kConstant, double(e + 127), 0.0)
        .device_made = !fp8;
  }

  // mHC site: mixing logits m = fn·v·rinv are ≈ N(0, 1) (fn std 1/sqrt(n·D), v RMS-normalised), scaled by
  // ~1 and offset by ~N(0, 0.5): a softmax over well-spread logits, which Sinkhorn balances in a few iterations.
  void hc(const std::string& prefix) {
    const int64_t n = c_.hc_mult, mix = (2 + n) * n;
    normal(prefix + "_fn", {mix, n * c_.dim}, 0.0f, float(1.0 / std::sqrt(double(n * c_.dim))), DType::kF32);
    normal(prefix + "_base", {mix}, 0.0f, 0.5f, DType::kF32);
    uniform(prefix + "_scale", {3}, 0.5f, 1.5f);
  }
  void hc_head(const std::string& prefix) {
    const int64_t n = c_.hc_mult;
    normal(prefix + "_fn", {n, n * c_.dim}, 0.0f, float(1.0 / std::sqrt(double(n * c_.dim))), DType::kF32);
    normal(prefix + "_base", {n}, 0.0f, 0.5f, DType::kF32);
    uniform(prefix + "_scale", {1}, 0.5f, 1.5f);
  }

  void compressor(const std::string& prefix, int64_t ratio, int64_t width) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    matrix(prefix + ".wkv.weight", coff * width, c_.dim);
    matrix(prefix + ".wgate.weight", coff * width, c_.dim);
    normal(prefix + ".ape", {ratio, coff * width}, 0.0f, 0.5f, DType::kF32);
    norm(prefix + ".norm.weight", width);
  }

  void layer(const std::string& p, int64_t index, bool hash) {
    const ModelConfig& c = c_;
    const int64_t D = c.dim, d = c.head_dim;
    norm(p + "attn_norm.weight", D);
    norm(p + "ffn_norm.weight", D);
    hc(p + "hc_attn");
    hc(p + "hc_ffn");
    matrix(p + "attn.wq_a.weight", c.q_lora_rank, D);
    norm(p + "attn.q_norm.weight", c.q_lora_rank);
    matrix(p + "attn.wq_b.weight", c.n_heads * d, c.q_lora_rank);
    matrix(p + "attn.wkv.weight", d, D);
    norm(p + "attn.kv_norm.weight", d);
    matrix(p + "attn.wo_a.weight", c.o_groups * c.o_lora_rank, c.heads_per_group() * d);
    matrix(p + "attn.wo_b.weight", D, c.o_groups * c.o_lora_rank);
    normal(p + "attn.attn_sink", {c.n_heads}, 0.0f, 0.5f, DType::kF32);
    const AttnType type = c.attn_type(index);
    if (type != AttnType::kSliding) compressor(p + "attn.compressor", int64_t(type), d);
    if (type == AttnType::kCsa) {
      matrix(p + "attn.indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      matrix(p + "attn.indexer.weights_proj.weight", c.index_n_heads, D);
      compressor(p + "attn.indexer.compressor", 4, c.index_head_dim);
    }
    matrix(p + "ffn.gate.weight", c.n_routed_experts, D);
    if (hash) {
      add(p + "ffn.gate.tid2eid", DType::kI64, {c.vocab_size, c.n_experts_per_tok}).expert_table = c.n_routed_experts;
    } else {
      normal(p + "ffn.gate.bias", {c.n_routed_experts}, 0.0f, 0.05f, DType::kF32);  // small: selection only
    }
    for (const char* w : {"w1", "w3"}) matrix(cat(p, "ffn.shared_experts.", w, ".weight"), c.moe_inter_dim, D);
    matrix(p + "ffn.shared_experts.w2.weight", D, c.moe_inter_dim);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      for (const char* w : {"w1", "w3"}) matrix(cat(p, "ffn.experts.", e, ".", w, ".weight"), c.moe_inter_dim, D);
      matrix(cat(p, "ffn.experts.", e, ".w2.weight"), D, c.moe_inter_dim);
    }
  }

  const ModelConfig& c_;
  uint64_t seed_;
  Tables& tables_;
  std::vector<Shard> shards_;
};

// Data offsets and the safetensors header of a shard. Tensors whose size is a multiple of 8 go first so every
// large tensor starts 8-byte aligned.
void layout(Shard& s) {
  std::stable_partition(s.tensors.begin(), s.tensors.end(), [](const TensorPlan& t) { return t.nbytes % 8 == 0; });
  std::vector<TensorEntry> entries;
  size_t offset = 0;
  for (TensorPlan& t : s.tensors) {
    t.offset = offset;
    entries.push_back({t.name, t.dtype, t.shape, t.nbytes});
    offset += t.nbytes;
  }
  s.header = safetensors_header(entries);
  s.header_bytes = 8 + s.header.size();
  s.bytes = s.header_bytes + offset;
}

// Bytes [begin, end) of tensor t (begin a multiple of 8) into dst = the tensor's first byte + begin.
void fill_range(const TensorPlan& t, size_t begin, size_t end, uint8_t* dst) {
  for (size_t off = begin; off < end; off += 8) {
    const uint64_t word = synth_word(t.fill, off / 8);
    std::memcpy(dst + (off - begin), &word, std::min<size_t>(8, end - off));
  }
}

// tid2eid [V, k]: each row k distinct experts (the hash router indexes tid2eid[token] and expects a set).
void fill_expert_table(const TensorPlan& t, uint8_t* dst) {
  const int64_t rows = t.shape[0], k = t.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    SplitMix64 draws{synth_random_word(t.fill.key, uint64_t(r))};
    int64_t row[64];
    for (int64_t j = 0; j < k; ++j) {
      bool distinct;
      do {
        row[j] = int64_t((draws.next() >> 11) % uint64_t(t.expert_table));
        distinct = std::find(row, row + j, row[j]) == row + j;
      } while (!distinct);
    }
    std::memcpy(dst + size_t(r * k) * 8, row, size_t(k) * 8);
  }
}

// Fills each tensor at data + its offset, in parallel chunks of ≤ 4 MiB (the result does not depend on the
// thread count). `skip` leaves a tensor untouched.
void fill_tensors(const std::vector<TensorPlan>& tensors, uint8_t* data,
                  const std::function<bool(const TensorPlan&)>& skip = {}) {
  struct Chunk { const TensorPlan* t; size_t begin, end; };
  constexpr size_t kChunk = size_t(4) << 20;
  std::vector<Chunk> chunks;
  for (const TensorPlan& t : tensors) {
    if (skip && skip(t)) continue;
    if (t.expert_table > 0) {
      chunks.push_back({&t, 0, t.nbytes});
      continue;
    }
    for (size_t b = 0; b < t.nbytes; b += kChunk) chunks.push_back({&t, b, std::min(t.nbytes, b + kChunk)});
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& ch = chunks[i];
    uint8_t* dst = data + ch.t->offset + ch.begin;
    if (ch.t->expert_table > 0) {
      fill_expert_table(*ch.t, dst);
    } else {
      fill_range(*ch.t, ch.begin, ch.end, dst);
    }
  }
}

// Creates the shard file at its final size, maps it and fills it in parallel chunks of ≤ 4 MiB.
void write_shard(const Shard& s, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  DSV4_CHECK(fd >= 0, path, ": cannot create (", std::strerror(errno), ")");
  // Allocated, not just sized: a full disk is an error here rather than a SIGBUS while writing the mapping.
  const int err = ::posix_fallocate(fd, 0, off_t(s.bytes));
  if (err != 0) {
    ::close(fd);
    fail(cat(path, ": cannot allocate ", s.bytes, " bytes (", std::strerror(err), ")"));
  }
  void* map = ::mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  DSV4_CHECK(map != MAP_FAILED, path, ": mmap failed (", std::strerror(map_err), ")");
  auto* base = static_cast<uint8_t*>(map);
  const uint64_t len = s.header.size();
  std::memcpy(base, &len, 8);
  std::memcpy(base + 8, s.header.data(), s.header.size());
  fill_tensors(s.tensors, base + s.header_bytes);
  DSV4_CHECK(::munmap(map, s.bytes) == 0, path, ": munmap failed (", std::strerror(errno), ")");
}

// The official attention schedule (spec §2.3): V4-Flash 2 sliding-only layers, V4-Pro 2 HCA layers, then
// CSA (even index) / HCA (odd index) alternating.
int preset_ratio(const std::string& preset, int64_t layer) {
  if (layer < 2) return preset == "v4-pro" ? 128 : 0;
  return layer % 2 == 0 ? 4 : 128;
}

json preset_json(const std::string& preset) {
  const bool pro = preset == "v4-pro";
  return json{
      {"architectures", json::array({"DeepseekV4ForCausalLM"})},
      {"model_type", "deepseek_v4"},
      {"vocab_size", 129280},
      {"hidden_size", pro ? 7168 : 4096},
      {"num_hidden_layers", pro ? 61 : 43},
      {"num_attention_heads", pro ? 128 : 64},
      {"num_key_value_heads", 1},
      {"head_dim", 512},
      {"qk_rope_head_dim", 64},
      {"q_lora_rank", pro ? 1536 : 1024},
      {"o_groups", pro ? 16 : 8},
      {"o_lora_rank", 1024},
      {"sliding_window", 128},
      {"compress_rope_theta", 160000.0},
      {"rope_theta", 10000.0},
      {"rope_scaling",
       {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536}, {"beta_fast", 32},
        {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576},
      {"index_n_heads", 64},
      {"index_head_dim", 128},
      {"index_topk", pro ? 1024 : 512},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-6},
      {"n_routed_experts", pro ? 384 : 256},
      {"num_experts_per_tok", 6},
      {"n_shared_experts", 1},
      {"moe_intermediate_size", pro ? 3072 : 2048},
      {"scoring_func", "sqrtsoftplus"},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", pro ? 2.5 : 1.5},
      {"num_hash_layers", 3},
      {"swiglu_limit", 10.0},
      {"num_nextn_predict_layers", 1},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", false},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"quantization_config",
       {{"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"scale_fmt", "ue8m0"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", {128, 128}}}},
      {"expert_dtype", "fp4"},
      {"torch_dtype", "bfloat16"},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"transformers_version", "4.57.1"},
  };
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= double(1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ull << 20));
  }
  return buf;
}

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}

// The files synth writes; a directory holding any of them (or other safetensors) already has a checkpoint.
bool is_checkpoint_file(const fs::path& p) {
  const std::string name = p.filename().string();
  return p.extension() == ".safetensors" || name == "model.safetensors.index.json" || name == "config.json" ||
         name == "generation_config.json";
}

void prepare_dir(const std::string& out_dir, bool force) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DSV4_CHECK(!ec && fs::is_directory(out_dir), out_dir, ": cannot create the output directory (",
             ec ? ec.message() : "exists and is not a directory", ")");
  std::vector<fs::path> existing;
  for (const auto& entry : fs::directory_iterator(out_dir))
    if (is_checkpoint_file(entry.path())) existing.push_back(entry.path());
  if (existing.empty()) return;
  DSV4_CHECK(force, out_dir, ": already holds a checkpoint (", existing.front().filename().string(),
             "); choose an empty directory or pass --force to overwrite it");
  for (const auto& p : existing) fs::remove(p);
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  DSV4_CHECK(out.good(), path.string(), ": cannot write (", std::strerror(errno), ")");
  out << j.dump(2) << "\n";
  DSV4_CHECK(out.good(), path.string(), ": write failed");
}

}  // namespace

std::vector<std::string> synth_presets() { return {"v4-flash", "v4-pro"}; }

const std::vector<std::string>& synth_override_options() {
  static const std::vector<std::string> names = {"set", "experts", "vocab", "dim", "inter"};
  return names;
}

void add_synth_override(const std::string& name, const std::string& value, SynthOptions* o) {
  static const std::map<std::string, std::string> kShort = {
      {"experts", "n_routed_experts"}, {"vocab", "vocab_size"}, {"dim", "hidden_size"}, {"inter", "moe_intermediate_size"}};
  const auto number = [](const std::string& option, const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    DSV4_CHECK(!text.empty() && end && *end == '\0' && std::isfinite(v), option, ": '", text, "' is not a number");
    return v;
  };
  if (name != "set") {
    const auto it = kShort.find(name);
    DSV4_ASSERT(it != kShort.end());
    const double v = number("--" + name, value);
    DSV4_CHECK(v >= 1 && v == std::floor(v), "--", name, " must be a positive integer, got ", value);
    o->overrides[it->second] = v;
    return;
  }
  for (size_t start = 0; start <= value.size();) {
    const size_t comma = std::min(value.find(',', start), value.size());
    const std::string item = value.substr(start, comma - start);
    const size_t eq = item.find('=');
    DSV4_CHECK(eq != std::string::npos && eq > 0, "--set: '", item, "' is not FIELD=VALUE");
    o->overrides[item.substr(0, eq)] = number("--set " + item.substr(0, eq), item.substr(eq + 1));
    start = comma + 1;
  }
}

json synth_config_json(const SynthOptions& o) {
  const auto presets = synth_presets();
  DSV4_CHECK(std::find(presets.begin(), presets.end(), o.preset) != presets.end(), "unknown preset '", o.preset,
             "' (available: v4-flash, v4-pro)");
  json j = preset_json(o.preset);
  const int64_t full = j["num_hidden_layers"].get<int64_t>();
  const int64_t layers = o.layers == 0 ? full : o.layers;
  DSV4_CHECK(layers >= 1 && layers <= full, "--layers ", o.layers, ": ", o.preset, " has 1 to ", full, " layers");
  j["num_hidden_layers"] = layers;
  j["num_nextn_predict_layers"] = o.mtp ? 1 : 0;
  j["num_hash_layers"] = std::min<int64_t>(3, layers);
  json ratios = json::array();
  for (int64_t i = 0; i < layers; ++i) ratios.push_back(preset_ratio(o.preset, i));
  if (o.mtp) ratios.push_back(0);  // the MTP block is sliding-only
  j["compress_ratios"] = ratios;

  for (const auto& [field, value] : o.overrides) {
    DSV4_CHECK(field != "num_hidden_layers" && field != "num_nextn_predict_layers", "override '", field,
               "': use --layers / --no-mtp");
    DSV4_CHECK(j.contains(field) && j[field].is_number(), "override '", field,
               "' is not a numeric field of the ", o.preset, " config.json");
    if (j[field].is_number_integer()) {
      DSV4_CHECK(value == std::floor(value) && std::fabs(value) < 1e15, "override '", field, "' must be an integer, got ",
                 value);
      j[field] = int64_t(value);
    } else {
      j[field] = value;
    }
  }
  const ModelConfig c = parse_config_json(j.dump(), cat("synth ", o.preset, " config"));
  // Routed experts pack two FP4 values per byte with one scale per 32 inputs, over D (w1, w3) and I (w2).
  DSV4_CHECK(c.dim % 32 == 0, "hidden_size ", c.dim, " must be a multiple of 32 (FP4 experts: one scale per 32 inputs)");
  DSV4_CHECK(c.moe_inter_dim % 32 == 0, "moe_intermediate_size ", c.moe_inter_dim,
             " must be a multiple of 32 (FP4 experts: one scale per 32 inputs)");
  DSV4_CHECK(c.n_experts_per_tok <= 64, "num_experts_per_tok ", c.n_experts_per_tok, " is larger than 64");
  return j;
}

SynthResult synth_checkpoint(const SynthOptions& o, const std::string& out_dir,
                             const std::function<void(size_t, size_t)>& progress) {
  const json config = synth_config_json(o);
  SynthResult result;
  result.config = parse_config_json(config.dump(), "synth config");
  Tables tables;  // the plans point into them
  Planner planner(result.config, o.seed, &tables);
  std::vector<Shard> shards = planner.plan(o.mtp);
  json weight_map = json::object();
  size_t total = 0, data_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    Shard& s = shards[i];
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    s.file = file;
    layout(s);
    for (const TensorPlan& t : s.tensors) {
      weight_map[t.name] = s.file;
      data_bytes += t.nbytes;
    }
    result.tensors += s.tensors.size();
    total += s.bytes;
  }
  result.bytes = total;
  if (o.dry_run) return result;

  prepare_dir(out_dir, o.force);
  const auto space = fs::space(out_dir);
  DSV4_CHECK(space.available >= total + (size_t(64) << 20), out_dir, ": the checkpoint needs ", human_bytes(double(total)),
             " but only ", human_bytes(double(space.available)), " are free");
  // config.json first: an unwritable directory fails before any generation work.
  write_json(fs::path(out_dir) / "config.json", config);
  write_json(fs::path(out_dir) / "generation_config.json",
             {{"bos_token_id", 0}, {"eos_token_id", 1}, {"do_sample", true}, {"temperature", 1.0}, {"top_p", 1.0}});

  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  for (const Shard& s : shards) {
    write_shard(s, (fs::path(out_dir) / s.file).string());
    done += s.bytes;
    if (progress) progress(done, total);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_json(fs::path(out_dir) / "model.safetensors.index.json",
             {{"metadata", {{"total_size", data_bytes}}}, {"weight_map", weight_map}});
  return result;
}

namespace {

// An in-memory checkpoint's storage: the value tables and one anonymous mapping holding every tensor.
struct SynthMemory {
  Tables tables;
  uint8_t* base = nullptr;
  size_t size = 0;
  ~SynthMemory() {
    if (base) ::munmap(base, size);
  }
};

}  // namespace

std::unique_ptr<const ModelWeights> synth_model(const SynthOptions& o, SynthPlace place, SynthResult* result_out) {
  const json config = synth_config_json(o);
  SynthResult result;
  result.config = parse_config_json(config.dump(), "synth config");
  auto memory = std::make_shared<SynthMemory>();
  Planner planner(result.config, o.seed, &memory->tables);
  std::vector<TensorPlan> tensors;
  for (Shard& s : planner.plan(o.mtp))
    for (TensorPlan& t : s.tensors) tensors.push_back(std::move(t));

  // Layout: the tensors made here back to back, 8-byte aligned and then read-only; after them the deferred
  // matrices, each on pages of its own that are never mapped in (PROT_NONE: a host read faults loudly instead
  // of seeing zeros), so their address range costs no memory.
  const auto deferred = [&](const TensorPlan& t) { return place == SynthPlace::kDevice && t.device_made; };
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const auto round_up = [](size_t n, size_t m) { return (n + m - 1) / m * m; };
  size_t cursor = 0;
  for (TensorPlan& t : tensors)
    if (!deferred(t)) {
      t.offset = cursor;
      cursor = round_up(cursor + t.nbytes, 8);
    }
  const size_t host_bytes = round_up(cursor, page);
  cursor = host_bytes;
  for (TensorPlan& t : tensors)
    if (deferred(t)) {
      t.offset = cursor;
      cursor += round_up(t.nbytes, page);
    }
  // What the host will make must fit its memory: a clear error here rather than the OOM killer mid-fill.
  const double avail = available_memory();
  DSV4_CHECK(avail <= 0 || double(host_bytes) <= 0.9 * avail, "synth ", o.preset, ": the ",
             place == SynthPlace::kHost ? "cpu backend holds every tensor in host memory, " : "host part takes ",
             human_bytes(double(host_bytes)), ", and this machine has ", human_bytes(avail),
             " available; use --layers N or smaller dims (--experts, --dim, ...), or a GPU (the cuda backend makes "
             "the matrices in GPU memory)");
  memory->size = std::max(cursor, page);
  void* map = ::mmap(nullptr, memory->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DSV4_CHECK(map != MAP_FAILED, "synth ", o.preset, ": cannot reserve ", human_bytes(double(memory->size)),
             " of address space (", std::strerror(errno), ")");
  memory->base = static_cast<uint8_t*>(map);

  const auto t0 = std::chrono::steady_clock::now();
  fill_tensors(tensors, memory->base, deferred);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  DSV4_CHECK(::mprotect(memory->base, host_bytes, PROT_READ) == 0 &&
                 (memory->size == host_bytes ||
                  ::mprotect(memory->base + host_bytes, memory->size - host_bytes, PROT_NONE) == 0),
             "synth: mprotect failed (", std::strerror(errno), ")");

  const std::string label = cat("synth ", o.preset, " (in memory)");
  std::vector<TensorInfo> infos;
  std::vector<GeneratedTensor> generated;
  for (const TensorPlan& t : tensors) {
    TensorInfo info;
    info.name = t.name;
    info.file = label;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.data = memory->base + t.offset;
    info.nbytes = t.nbytes;
    infos.push_back(std::move(info));
    if (deferred(t)) {
      generated.push_back({memory->base + t.offset, t.nbytes, t.fill});
    } else {
      result.host_bytes += t.nbytes;
    }
    result.bytes += t.nbytes;
  }
  result.tensors = tensors.size();
  if (result_out) *result_out = result;
  auto ckpt = Checkpoint::in_memory(label, std::move(infos), std::move(generated), memory);
  return load_model(std::move(ckpt), result.config);
}

}  // namespace dsv4
