// A checkpoint directory: one or many safetensors files (model.safetensors.index.json when sharded),
// with every tensor reachable by its OFFICIAL name. Checkpoints written by transformers' save_pretrained
// are translated on open (names, and fused expert tensors split into per-expert views).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/safetensors.h"

namespace dsv4 {

class Checkpoint {
 public:
  static std::shared_ptr<const Checkpoint> open(const std::string& dir);

  const TensorInfo* find(const std::string& name) const;
  // Throws "<dir>: missing tensor '<name>'" when absent.
  const TensorInfo& get(const std::string& name) const;
  bool has_transformers_names() const { return transformers_names_; }
  size_t total_bytes() const;  // of all mapped files
  // Reads every page of the mapped files once (so the first forward pass does not stall on disk), calling
  // progress(done_bytes, total_bytes) as it goes.
  void prefetch(const std::function<void(size_t, size_t)>& progress) const;
  const std::string& dir() const { return dir_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  void add_file(const std::string& path);
  void add_tensor(const TensorInfo& info);

  std::string dir_;
  bool transformers_names_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
};

// Official name for a transformers parameter name ("model.layers.3.self_attn.q_a_proj.weight" →
// "layers.3.attn.wq_a.weight"); names already official are returned unchanged.
std::string official_tensor_name(const std::string& name);

}  // namespace dsv4
