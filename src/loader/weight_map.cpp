#include "loader/weight_map.h"

#include <cstring>

#include "core/error.h"
#include "loader/checkpoint.h"
#include "loader/hf_config.h"

namespace dsv4 {

namespace {

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  size_t i = 0;
  for (int64_t d : dims) s += (i++ ? ", " : "") + std::to_string(d);
  return s + "]";
}

class WeightBuilder {
 public:
  explicit WeightBuilder(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  // A linear layer "<prefix>.weight" (+ "<prefix>.scale" when quantised).
  Weight linear(const std::string& prefix, int64_t rows, int64_t cols, bool allow_fp4 = false) {
    return matrix(prefix + ".weight", prefix + ".scale", rows, cols, allow_fp4);
  }

  // A [rows, cols] matrix stored as BF16/F16/F32, FP8 e4m3 with 128×128 block scales, or (when
  // allow_fp4) packed FP4 e2m1 with per-32 scales; scale_name is only read for the quantised formats.
  Weight matrix(const std::string& name, const std::string& scale_name, int64_t rows, int64_t cols,
                bool allow_fp4 = false) {
    const TensorInfo& t = ckpt_.get(name);
    const std::string where = cat(t.file, ": tensor '", t.name, "'");
    Weight w;
    w.dtype = t.dtype;
    w.rows = rows;
    w.cols = cols;
    w.data = t.data;
    switch (t.dtype) {
      case DType::kF32: case DType::kBF16: case DType::kF16: case DType::kF8E4M3:
        expect_shape(t, {rows, cols});
        w.row_stride = cols * int64_t(dtype_size(t.dtype));
        break;
      case DType::kI8:
        DSV4_CHECK(allow_fp4, where, ": packed FP4 (I8) is only supported for routed experts");
        DSV4_CHECK(cols % 32 == 0, where, ": FP4 input dimension ", cols, " is not a multiple of 32");
        expect_shape(t, {rows, cols / 2});
        w.row_stride = cols / 2;
        break;
      default:
        fail(cat(where, " has dtype ", dtype_name(t.dtype), ", expected BF16, F16, F32, F8_E4M3",
                 allow_fp4 ? " or I8 (packed FP4)" : ""));
    }
    if (t.dtype == DType::kF8E4M3 || t.dtype == DType::kI8) {
      const TensorInfo* s = ckpt_.find(scale_name);
      DSV4_CHECK(s != nullptr, ckpt_.dir(), ": missing tensor '", scale_name, "' (block scales of ",
                 dtype_name(t.dtype), " weight '", t.name, "')");
      const int64_t br = t.dtype == DType::kI8 ? 1 : 128, bc = t.dtype == DType::kI8 ? 32 : 128;
      const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
      DSV4_CHECK(s->dtype == DType::kF8E8M0 || s->dtype == DType::kF32, s->file, ": tensor '", s->name,
                 "' has dtype ", dtype_name(s->dtype), ", expected F8_E8M0 or F32");
      expect_shape(*s, {sr, sc});
      w.scale = s->data;
      w.scale_dtype = s->dtype;
      w.scale_block_rows = br;
      w.scale_block_cols = bc;
      w.scale_stride = sc;
    }
    w.id = int(next_id_++);
    return w;
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const TensorInfo& t = ckpt_.get(name);
    expect_shape(t, {n});
    return tensor_to_floats(t);
  }

  std::vector<float> table(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo& t = ckpt_.get(name);
    expect_shape(t, {rows, cols});
    return tensor_to_floats(t);
  }

  std::vector<int32_t> expert_table(const std::string& name, int64_t rows, int64_t cols, int64_t n_experts) {
    const TensorInfo& t = ckpt_.get(name);
    expect_shape(t, {rows, cols});
    DSV4_CHECK(t.dtype == DType::kI64 || t.dtype == DType::kI32, t.file, ": tensor '", t.name, "' has dtype ",
               dtype_name(t.dtype), ", expected I64 or I32");
    std::vector<int32_t> out(size_t(rows * cols));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      if (t.dtype == DType::kI64) {
        std::memcpy(&v, t.data + 8 * i, 8);
      } else {
        int32_t v32;
        std::memcpy(&v32, t.data + 4 * i, 4);
        v = v32;
      }
      DSV4_CHECK(v >= 0 && v < n_experts, t.file, ": tensor '", t.name, "' entry ", i, " is expert ", v,
                 ", outside [0, ", n_experts, ")");
      out[i] = int32_t(v);
    }
    // A token's experts are a set: the MoE kernels stage each token at most once per expert.
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 1; j < cols; ++j)
        for (int64_t i = 0; i < j; ++i)
          DSV4_CHECK(out[size_t(r * cols + i)] != out[size_t(r * cols + j)], t.file, ": tensor '", t.name, "' row ", r,
                     " names expert ", out[size_t(r * cols + j)], " twice");
    return out;
  }

  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

 private:
  void expect_shape(const TensorInfo& t, std::initializer_list<int64_t> dims) {
    const std::vector<int64_t> want(dims);
    DSV4_CHECK(t.shape == want, t.file, ": tensor '", t.name, "' has shape ", t.shape_str(), ", expected ",
               shape_str(dims), " from config.json");
  }

  const Checkpoint& ckpt_;
  size_t next_id_ = 0;
};

HcWeights load_hc(WeightBuilder& b, const std::string& prefix, const ModelConfig& c) {
  const int64_t n = c.hc_mult, mix = (2 + n) * n;
  HcWeights hc;
  hc.fn = b.matrix(prefix + "_fn", "", mix, n * c.dim);
  hc.base = b.vector(prefix + "_base", mix);
  hc.scale = b.vector(prefix + "_scale", 3);
  return hc;
}

HcHeadWeights load_hc_head(WeightBuilder& b, const std::string& prefix, const ModelConfig& c) {
  HcHeadWeights hc;
  hc.fn = b.matrix(prefix + "_fn", "", c.hc_mult, c.hc_mult * c.dim);
  hc.base = b.vector(prefix + "_base", c.hc_mult);
  hc.scale = b.vector(prefix + "_scale", 1);
  return hc;
}

CompressorWeights load_compressor(WeightBuilder& b, const std::string& prefix, const ModelConfig& c,
                                  int64_t ratio, int64_t width) {
  CompressorWeights cw;
  cw.ratio = ratio;
  cw.width = width;
  cw.overlap = ratio == 4;
  const int64_t coff = cw.overlap ? 2 : 1;
  cw.wkv = b.linear(prefix + ".wkv", coff * width, c.dim);
  cw.wgate = b.linear(prefix + ".wgate", coff * width, c.dim);
  cw.ape = b.table(prefix + ".ape", ratio, coff * width);
  cw.norm = b.vector(prefix + ".norm.weight", width);
  return cw;
}

ExpertWeights load_expert(WeightBuilder& b, const std::string& prefix, const ModelConfig& c, bool allow_fp4) {
  ExpertWeights e;
  e.w1 = b.linear(prefix + ".w1", c.moe_inter_dim, c.dim, allow_fp4);
  e.w3 = b.linear(prefix + ".w3", c.moe_inter_dim, c.dim, allow_fp4);
  e.w2 = b.linear(prefix + ".w2", c.dim, c.moe_inter_dim, allow_fp4);
  return e;
}

LayerWeights load_layer(WeightBuilder& b, const std::string& p, const ModelConfig& c, int64_t layer_index,
                        bool hash_routed) {
  LayerWeights l;
  l.attn_type = c.attn_type(layer_index);
  l.hash_routed = hash_routed;
  l.attn_norm = b.vector(p + "attn_norm.weight", c.dim);
  l.ffn_norm = b.vector(p + "ffn_norm.weight", c.dim);
  l.hc_attn = load_hc(b, p + "hc_attn", c);
  l.hc_ffn = load_hc(b, p + "hc_ffn", c);

  AttentionWeights& a = l.attn;
  const std::string ap = p + "attn.";
  a.wq_a = b.linear(ap + "wq_a", c.q_lora_rank, c.dim);
  a.q_norm = b.vector(ap + "q_norm.weight", c.q_lora_rank);
  a.wq_b = b.linear(ap + "wq_b", c.n_heads * c.head_dim, c.q_lora_rank);
  a.wkv = b.linear(ap + "wkv", c.head_dim, c.dim);
  a.kv_norm = b.vector(ap + "kv_norm.weight", c.head_dim);
  a.wo_a = b.linear(ap + "wo_a", c.o_groups * c.o_lora_rank, c.heads_per_group() * c.head_dim);
  a.wo_b = b.linear(ap + "wo_b", c.dim, c.o_groups * c.o_lora_rank);
  a.sinks = b.vector(ap + "attn_sink", c.n_heads);
  if (l.attn_type != AttnType::kSliding) {
    const int64_t ratio = int64_t(l.attn_type);
    a.compressor = load_compressor(b, ap + "compressor", c, ratio, c.head_dim);
  }
  if (l.attn_type == AttnType::kCsa) {
    a.indexer.wq_b = b.linear(ap + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    a.indexer.weights_proj = b.linear(ap + "indexer.weights_proj", c.index_n_heads, c.dim);
    a.indexer.compressor = load_compressor(b, ap + "indexer.compressor", c, 4, c.index_head_dim);
  }

  MoeWeights& m = l.moe;
  const std::string fp = p + "ffn.";
  m.gate = b.linear(fp + "gate", c.n_routed_experts, c.dim);
  if (hash_routed) {
    m.tid2eid = b.expert_table(fp + "gate.tid2eid", c.vocab_size, c.n_experts_per_tok, c.n_routed_experts);
  } else {
    m.gate_bias = b.vector(fp + "gate.bias", c.n_routed_experts);
  }
  m.experts.reserve(size_t(c.n_routed_experts));
  for (int64_t e = 0; e < c.n_routed_experts; ++e)
    m.experts.push_back(load_expert(b, cat(fp, "experts.", e), c, /*allow_fp4=*/true));
  m.shared = load_expert(b, fp + "shared_experts", c, /*allow_fp4=*/false);
  return l;
}

}  // namespace

std::unique_ptr<const ModelWeights> load_model(const std::string& model_dir) {
  ModelConfig config = load_config(model_dir);
  return load_model(Checkpoint::open(model_dir), std::move(config));
}

std::unique_ptr<const ModelWeights> load_model(std::shared_ptr<const Checkpoint> ckpt, ModelConfig config) {
  auto model = std::make_unique<ModelWeights>();
  model->config = std::move(config);
  const ModelConfig& c = model->config;
  model->storage = std::move(ckpt);
  WeightBuilder b(*model->storage);

  model->embed = b.linear("embed", c.vocab_size, c.dim);
  model->head = b.linear("head", c.vocab_size, c.dim);
  model->norm = b.vector("norm.weight", c.dim);
  model->hc_head = load_hc_head(b, "hc_head", c);
  for (int64_t i = 0; i < c.n_layers; ++i)
    model->layers.push_back(load_layer(b, cat("layers.", i, "."), c, i, c.is_hash_layer(i)));

  // The MTP module is optional: transformers checkpoints do not carry it.
  for (int64_t k = 0; k < c.n_mtp_layers && b.has(cat("mtp.", k, ".e_proj.weight")); ++k) {
    const std::string p = cat("mtp.", k, ".");
    MtpWeights t;
    t.e_proj = b.linear(p + "e_proj", c.dim, c.dim);
    t.h_proj = b.linear(p + "h_proj", c.dim, c.dim);
    t.enorm = b.vector(p + "enorm.weight", c.dim);
    t.hnorm = b.vector(p + "hnorm.weight", c.dim);
    t.norm = b.vector(p + "norm.weight", c.dim);
    t.hc_head = load_hc_head(b, p + "hc_head", c);
    t.block = load_layer(b, p, c, c.n_layers + k, /*hash_routed=*/false);
    model->mtp.push_back(std::move(t));
  }
  index_matrices(*model);
  return model;
}

}  // namespace dsv4
