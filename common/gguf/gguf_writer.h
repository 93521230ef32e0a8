// GgufWriter: writes a GGUF version 3 file (metadata, tensor directory,
// 32-byte aligned data). Used by `tandem make-model` to write small
// random-weight models for tests, and by tests that need malformed files.
//
//   GgufWriter w;
//   w.SetString("general.architecture", "llama");
//   w.SetUint32("llama.block_count", 2);
//   w.AddTensor("token_embd.weight", {dim, vocab}, GgmlType::kQ8_0, floats);
//   TANDEM_RETURN_IF_ERROR(w.WriteFile(path));
//
// Thread-compatible.
#ifndef TANDEM_COMMON_GGUF_GGUF_WRITER_H_
#define TANDEM_COMMON_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/gguf/ggml_types.h"

namespace tandem::gguf {

class GgufWriter {
 public:
  void SetUint32(const std::string& key, uint32_t value);
  void SetInt32(const std::string& key, int32_t value);
  void SetFloat32(const std::string& key, float value);
  void SetBool(const std::string& key, bool value);
  void SetString(const std::string& key, const std::string& value);
  void SetStringArray(const std::string& key, const std::vector<std::string>& values);
  void SetInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // `shape` in ggml order (shape[0] contiguous). `values` has the product of
  // `shape` floats and is converted to `type`. Returns InvalidArgument if the
  // row length is not a whole number of blocks of `type`.
  absl::Status AddTensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                         absl::Span<const float> values);

  // The complete file image.
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    std::string encoded;  // type tag + value, already serialized
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    std::string bytes;
  };
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_GGUF_WRITER_H_
