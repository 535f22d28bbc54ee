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
#include "loader/synth_fill.h"

namespace dsv4 {

class Checkpoint {
 public:
  static std::shared_ptr<const Checkpoint> open(const std::string& dir);
  // A checkpoint held in memory (loader/synth.h): tensors point into storage that `owner` keeps alive; the
  // `generated` ones (sorted by address or not) are never readable on the host and are made where needed.
  // `label` stands for the directory in messages.
  static std::shared_ptr<const Checkpoint> in_memory(std::string label, std::vector<TensorInfo> tensors,
                                                     std::vector<GeneratedTensor> generated,
                                                     std::shared_ptr<const void> owner);

  const TensorInfo* find(const std::string& name) const;
  // Throws "<dir>: missing tensor '<name>'" when absent.
  const TensorInfo& get(const std::string& name) const;
  bool has_transformers_names() const { return transformers_names_; }
  size_t total_bytes() const;  // of all mapped files, or of the tensors held in memory
  // The generated tensor whose bytes include `p`, or null: a backend that can make them (the CUDA one) does,
  // any other must not read them.
  const GeneratedTensor* generated(const uint8_t* p) const;
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
  std::vector<GeneratedTensor> generated_;  // by address
  std::shared_ptr<const void> memory_;      // in_memory's storage
  size_t memory_bytes_ = 0;
};

// Official name for a transformers parameter name ("model.layers.3.self_attn.q_a_proj.weight" →
// "layers.3.attn.wq_a.weight"); names already official are returned unchanged.
std::string official_tensor_name(const std::string& name);

}  // namespace dsv4
