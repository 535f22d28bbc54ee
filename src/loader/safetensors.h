// safetensors reader: validates the header of one memory-mapped file and exposes its tensors in place.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data section; offsets are relative to the data section.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace dsv4 {

struct TensorInfo {
  std::string name;
  std::string file;  // path, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;  // "[512, 128]"
};

// The values of a floating-point tensor (F32 / BF16 / F16) as fp32; other dtypes throw an Error naming it.
std::vector<float> tensor_to_floats(const TensorInfo& t);

class SafetensorsFile {
 public:
  // Maps and validates the file; throws Error naming the file and the offending tensor.
  explicit SafetensorsFile(const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }
  const MappedFile& mapped() const { return file_; }

 private:
  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
};

// The header of a safetensors file whose tensors are stored back to back in the given order: JSON padded with
// spaces so that the data section (after the u64 length and the header) starts 8-byte aligned.
struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t bytes;
};
std::string safetensors_header(const std::vector<TensorEntry>& tensors);

// Writes tensors as one safetensors file (header sorted by name, data 8-byte aligned per tensor order given).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace dsv4
