#include "loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"

namespace dsv4 {

namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

}  // namespace

std::string official_tensor_name(const std::string& name) {
  std::string n = name;
  if (starts_with(n, "model.")) n = n.substr(6);
  // Ordered: longer, more specific patterns first.
  static const std::pair<const char*, const char*> kRules[] = {
      {"embed_tokens.weight", "embed.weight"},
      {"lm_head.weight", "head.weight"},
      {"hc_head.hc_fn", "hc_head_fn"},
      {"hc_head.hc_base", "hc_head_base"},
      {"hc_head.hc_scale", "hc_head_scale"},
      {".input_layernorm.", ".attn_norm."},
      {".post_attention_layernorm.", ".ffn_norm."},
      {".attn_hc.fn", ".hc_attn_fn"},
      {".attn_hc.base", ".hc_attn_base"},
      {".attn_hc.scale", ".hc_attn_scale"},
      {".ffn_hc.fn", ".hc_ffn_fn"},
      {".ffn_hc.base", ".hc_ffn_base"},
      {".ffn_hc.scale", ".hc_ffn_scale"},
      {".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."},
      {".self_attn.compressor.indexer.weights_proj.", ".attn.indexer.weights_proj."},
      {".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."},
      {".self_attn.compressor.indexer.", ".attn.indexer.compressor."},
      {".self_attn.", ".attn."},
      {".compressor.kv_proj.", ".compressor.wkv."},
      {".compressor.gate_proj.", ".compressor.wgate."},
      {".compressor.position_bias", ".compressor.ape"},
      {".compressor.kv_norm.", ".compressor.norm."},
      {".attn.q_a_proj.", ".attn.wq_a."},
      {".attn.q_a_norm.", ".attn.q_norm."},
      {".attn.q_b_proj.", ".attn.wq_b."},
      {".attn.kv_proj.", ".attn.wkv."},
      {".attn.o_a_proj.", ".attn.wo_a."},
      {".attn.o_b_proj.", ".attn.wo_b."},
      {".attn.sinks", ".attn.attn_sink"},
      {".attn.norm.weight", ".attn.kv_norm.weight"},  // transformers' save_pretrained spelling of kv_norm
      {".mlp.gate.e_score_correction_bias", ".ffn.gate.bias"},
      {".mlp.shared_experts.gate_proj.", ".ffn.shared_experts.w1."},
      {".mlp.shared_experts.up_proj.", ".ffn.shared_experts.w3."},
      {".mlp.shared_experts.down_proj.", ".ffn.shared_experts.w2."},
      {".mlp.", ".ffn."},
      {".weight_scale_inv", ".scale"},
  };
  for (const auto& [from, to] : kRules) replace_all(n, from, to);
  return n;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  DSV4_CHECK(t != nullptr, dir_, ": missing tensor '", name, "'");
  return *t;
}

// transformers stores routed experts fused per layer: gate_up_proj [E, 2I, D] (gate rows first, then up)
// and down_proj [E, D, I]. They become per-expert views ffn.experts.<e>.w1/w3/w2.weight.
static bool split_fused_experts(const std::string& name, const TensorInfo& info,
                                std::vector<TensorInfo>* out) {
  static const std::regex kFused(R"((layers\.\d+)\.ffn\.experts\.(gate_up_proj|down_proj))");
  std::smatch m;
  if (!std::regex_match(name, m, kFused)) return false;
  DSV4_CHECK(info.shape.size() == 3, info.file, ": tensor '", info.name, "' has shape ", info.shape_str(),
             ", expected [experts, out, in]");
  const bool gate_up = m[2] == "gate_up_proj";
  const int64_t experts = info.shape[0], rows = info.shape[1], cols = info.shape[2];
  DSV4_CHECK(!gate_up || rows % 2 == 0, info.file, ": tensor '", info.name, "' has an odd gate_up dimension");
  const size_t row_bytes = size_t(cols) * dtype_size(info.dtype);
  for (int64_t e = 0; e < experts; ++e) {
    const uint8_t* base = info.data + size_t(e) * size_t(rows) * row_bytes;
    auto view = [&](const char* w, int64_t first_row, int64_t n_rows) {
      TensorInfo v = info;
      v.name = cat(m[1].str(), ".ffn.experts.", e, ".", w, ".weight");
      v.shape = {n_rows, cols};
      v.data = base + size_t(first_row) * row_bytes;
      v.nbytes = size_t(n_rows) * row_bytes;
      out->push_back(v);
    };
    if (gate_up) {
      view("w1", 0, rows / 2);
      view("w3", rows / 2, rows / 2);
    } else {
      view("w2", 0, rows);
    }
  }
  return true;
}

void Checkpoint::add_tensor(const TensorInfo& info) {
  std::string name = official_tensor_name(info.name);
  if (name != info.name) transformers_names_ = true;
  std::vector<TensorInfo> views;
  if (!split_fused_experts(name, info, &views)) {
    views.push_back(info);
    views.back().name = name;
  }
  for (auto& v : views) {
    const auto [it, inserted] = tensors_.emplace(v.name, v);
    DSV4_CHECK(inserted, dir_, ": tensor '", v.name, "' appears twice (", it->second.file, " and ", v.file, ")");
  }
}

void Checkpoint::add_file(const std::string& path) {
  files_.push_back(std::make_unique<SafetensorsFile>(path));
  for (const auto& [name, info] : files_.back()->tensors()) add_tensor(info);
}

std::shared_ptr<const Checkpoint> Checkpoint::in_memory(std::string label, std::vector<TensorInfo> tensors,
                                                         std::vector<GeneratedTensor> generated,
                                                         std::shared_ptr<const void> owner) {
  auto ckpt = std::shared_ptr<Checkpoint>(new Checkpoint());
  ckpt->dir_ = std::move(label);
  for (const TensorInfo& t : tensors) {
    ckpt->add_tensor(t);
    ckpt->memory_bytes_ += t.nbytes;
  }
  std::sort(generated.begin(), generated.end(),
            [](const GeneratedTensor& a, const GeneratedTensor& b) { return a.data < b.data; });
  ckpt->generated_ = std::move(generated);
  ckpt->memory_ = std::move(owner);
  return ckpt;
}

const GeneratedTensor* Checkpoint::generated(const uint8_t* p) const {
  auto it = std::upper_bound(generated_.begin(), generated_.end(), p,
                             [](const uint8_t* q, const GeneratedTensor& g) { return q < g.data; });
  if (it == generated_.begin()) return nullptr;
  --it;
  return p < it->data + it->nbytes ? &*it : nullptr;
}

size_t Checkpoint::total_bytes() const {
  size_t total = memory_bytes_;
  for (const auto& f : files_) total += f->mapped().size();
  return total;
}

void Checkpoint::prefetch(const std::function<void(size_t, size_t)>& progress) const {
  constexpr size_t kPage = 4096, kReport = size_t(64) << 20;
  const size_t total = total_bytes();
  size_t done = 0;
  volatile uint8_t sink = 0;
  for (const auto& f : files_) {
    const uint8_t* data = f->mapped().data();
    const size_t size = f->mapped().size();
    for (size_t off = 0; off < size; off += kPage) {
      sink = sink + data[off];
      if ((done + off) % kReport < kPage) progress(done + off, total);
    }
    done += size;
  }
  progress(total, total);
}

std::shared_ptr<const Checkpoint> Checkpoint::open(const std::string& dir) {
  DSV4_CHECK(fs::is_directory(dir), dir, ": model directory does not exist");
  auto ckpt = std::shared_ptr<Checkpoint>(new Checkpoint());
  ckpt->dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail(cat(index_path.string(), ": not valid JSON (", e.what(), ")"));
    }
    DSV4_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               index_path.string(), ": missing object field 'weight_map'");
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) {
      DSV4_CHECK(file.is_string(), index_path.string(), ": weight_map entry '", name, "' is not a file name");
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) {
      const fs::path p = fs::path(dir) / shard;
      DSV4_CHECK(fs::exists(p), index_path.string(), ": lists shard '", shard, "' which does not exist");
      ckpt->add_file(p.string());
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      const bool present = ckpt->find(official_tensor_name(name)) != nullptr ||
                           name.find("experts.gate_up_proj") != std::string::npos ||
                           name.find("experts.down_proj") != std::string::npos;
      DSV4_CHECK(present, index_path.string(), ": tensor '", name, "' is listed for shard '",
                 file.get<std::string>(), "' but missing there");
    }
  } else {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    DSV4_CHECK(!files.empty(), dir, ": no .safetensors files (and no model.safetensors.index.json)");
    for (const auto& f : files) ckpt->add_file(f);
  }
  return ckpt;
}

}  // namespace dsv4
