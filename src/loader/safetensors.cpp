#include "loader/safetensors.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<float> tensor_to_floats(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    switch (t.dtype) {
      case DType::kF32: std::memcpy(&out[i], t.data + 4 * i, 4); break;
      case DType::kBF16: std::memcpy(&h, t.data + 2 * i, 2); out[i] = bf16_to_f32(h); break;
      case DType::kF16: std::memcpy(&h, t.data + 2 * i, 2); out[i] = f16_to_f32(h); break;
      default:
        fail(cat(t.file, ": tensor '", t.name, "' has dtype ", dtype_name(t.dtype), ", expected F32, BF16 or F16"));
    }
  }
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const uint8_t* base = file_.data();
  const size_t size = file_.size();
  DSV4_CHECK(size >= 8, path, ": truncated safetensors file (", size, " bytes, no header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian hosts only (x86-64, aarch64)
  DSV4_CHECK(header_len <= size - 8, path, ": header length ", header_len, " exceeds the file size ", size,
             " (truncated or not a safetensors file)");
  const char* header_begin = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    fail(cat(path, ": safetensors header is not valid JSON (", e.what(), ")"));
  }
  DSV4_CHECK(header.is_object(), path, ": safetensors header is not a JSON object");

  const uint8_t* data_section = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = cat(path, ": tensor '", name, "'");
    DSV4_CHECK(entry.is_object(), where, ": header entry is not an object");
    DSV4_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where, ": missing string field 'dtype'");
    DSV4_CHECK(entry.contains("shape") && entry["shape"].is_array(), where, ": missing array field 'shape'");
    DSV4_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                   entry["data_offsets"].size() == 2,
               where, ": missing field 'data_offsets' [begin, end]");
    TensorInfo info;
    info.name = name;
    info.file = path;
    const std::string dtype = entry["dtype"].get<std::string>();
    DSV4_CHECK(parse_dtype(dtype, &info.dtype), where, ": unsupported dtype '", dtype,
               "' (dsv4 reads F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I32, I64)");
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      DSV4_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                 ": shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      DSV4_CHECK(dim == 0 || numel <= (uint64_t(1) << 62) / dim, where, ": shape overflows");
      numel *= dim;
      info.shape.push_back(int64_t(dim));
    }
    const auto& offsets = entry["data_offsets"];
    DSV4_CHECK(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), where,
               ": data_offsets must be non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    DSV4_CHECK(begin <= end && end <= data_size, where, ": data_offsets [", begin, ", ", end,
               "] fall outside the data section of ", data_size, " bytes (file truncated or corrupt)");
    const uint64_t expected = numel * dtype_size(info.dtype);
    DSV4_CHECK(end - begin == expected, where, ": holds ", end - begin, " bytes but ", dtype, " ",
               info.shape_str(), " needs ", expected);
    info.data = data_section + begin;
    info.nbytes = size_t(expected);
    tensors_.emplace(name, std::move(info));
  }
}

std::string safetensors_header(const std::vector<TensorEntry>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';
  return text;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<TensorEntry> entries;
  for (const auto& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  const std::string text = safetensors_header(entries);
  std::ofstream out(path, std::ios::binary);
  DSV4_CHECK(out.good(), path, ": cannot open for writing");
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  DSV4_CHECK(out.good(), path, ": write failed");
}

}  // namespace dsv4
