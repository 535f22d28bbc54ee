// Per-layer weight structs. Matrices stay in their checkpoint format (views into the mmapped files);
// small vectors (norm gains, mHC parameters, sinks, biases, ape, tid2eid) are decoded to fp32/int32 at load.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace dsv4 {

// A logical [rows, cols] matrix in checkpoint storage.
//   F32/BF16/F16: dense row-major.
//   F8E4M3: dense row-major bytes; scale grid [ceil(rows/128), ceil(cols/128)] (block 128×128).
//   I8 (packed fp4 e2m1): [rows, cols/2] bytes, element 2j in the low nibble; scale grid [rows, cols/32].
// Scales are E8M0 bytes or F32 multipliers (the transformers FP8 integration stores F32).
struct Weight {
  int id = -1;  // index in ModelWeights::matrices, lets a backend keep its own copy of the data
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  int64_t row_stride = 0;  // bytes between rows
  const uint8_t* scale = nullptr;
  DType scale_dtype = DType::kF8E8M0;
  int64_t scale_block_rows = 0, scale_block_cols = 0;  // block covered by one scale
  int64_t scale_stride = 0;                            // scale elements between scale rows

  bool empty() const { return data == nullptr; }
};

struct HcWeights {  // one mHC site: fn [(2+n)·n, n·D], base [(2+n)·n], scale [3]
  Weight fn;
  std::vector<float> base, scale;
};

struct HcHeadWeights {  // final collapse: fn [n, n·D], base [n], scale [1]
  Weight fn;
  std::vector<float> base, scale;
};

struct CompressorWeights {  // m = ratio, c = width, coff = 2 with overlap (m = 4)
  Weight wkv, wgate;        // [coff·c, D]
  std::vector<float> ape;   // [m, coff·c]
  std::vector<float> norm;  // [c]
  int64_t ratio = 0, width = 0;
  bool overlap = false;
};

struct IndexerWeights {  // CSA only
  Weight wq_b;           // [n_I·d_I, r_q]
  Weight weights_proj;   // [n_I, D]
  CompressorWeights compressor;  // c = d_I
};

struct AttentionWeights {
  Weight wq_a;                 // [r_q, D]
  std::vector<float> q_norm;   // [r_q]
  Weight wq_b;                 // [H·d_h, r_q]
  Weight wkv;                  // [d_h, D]
  std::vector<float> kv_norm;  // [d_h]
  Weight wo_a;                 // [G·r_o, (H/G)·d_h]
  Weight wo_b;                 // [D, G·r_o]
  std::vector<float> sinks;    // [H]
  CompressorWeights compressor;  // ratio != 0
  IndexerWeights indexer;        // ratio == 4
};

struct ExpertWeights {
  Weight w1, w3;  // gate, up: [I, D]
  Weight w2;      // down: [D, I]
};

struct MoeWeights {
  Weight gate;                    // router [E, D]
  std::vector<float> gate_bias;   // [E], scored layers only (selection only)
  std::vector<int32_t> tid2eid;   // [V, k], hash layers only
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct LayerWeights {
  AttnType attn_type = AttnType::kSliding;
  bool hash_routed = false;
  std::vector<float> attn_norm, ffn_norm;  // [D]
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct MtpWeights {
  Weight e_proj, h_proj;                  // [D, D]
  std::vector<float> enorm, hnorm, norm;  // [D]
  HcHeadWeights hc_head;
  LayerWeights block;
};

class Checkpoint;  // loader/checkpoint.h: owns the mapped files the Weight views point into

struct ModelWeights {
  ModelConfig config;
  Weight embed;             // [V, D]
  Weight head;              // [V, D]
  std::vector<float> norm;  // [D]
  HcHeadWeights hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;           // empty when the checkpoint has no MTP module
  std::vector<const Weight*> matrices;   // every matrix above, by Weight::id
  std::shared_ptr<const Checkpoint> storage;
};

// Bytes of a matrix's elements and scales as its checkpoint stores them; a view (model/parallel.h) counts only
// its slice. 0 for an empty weight.
double stored_bytes(const Weight& w);

// Fills model.matrices from the matrices above (after loading, or after a copy: the pointers are into `model`).
void index_matrices(ModelWeights& model);

}  // namespace dsv4
