// GgufFile: a read-only view of a GGUF file (versions 2 and 3): metadata
// key/values, the tensor directory, and tensor data memory-mapped in place.
//
// A malformed, truncated or unsupported file is refused with a Status that
// names what is wrong (the offset, the key or the tensor), never a crash:
// every length and offset is checked against the file size before use.
//
//   TANDEM_ASSIGN_OR_RETURN(auto file, GgufFile::Open("model.gguf"));
//   TANDEM_ASSIGN_OR_RETURN(uint32_t layers, file->GetUint32("llama.block_count"));
//   const GgufTensor* embd = file->FindTensor("token_embd.weight");
//
// Thread-safe after Open (immutable).
#ifndef TANDEM_COMMON_GGUF_GGUF_FILE_H_
#define TANDEM_COMMON_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/gguf/ggml_types.h"

namespace tandem::gguf {

// GGUF metadata value types (the file's numbering).
enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// One metadata value. Integers of every width are kept as int64/uint64,
// floats as double; arrays keep their element type.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType array_type = GgufValueType::kUint8;  // for kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<std::string>,
               std::vector<int64_t>, std::vector<double>, std::vector<bool>>
      value;
};

struct GgufTensor {
  std::string name;
  // ggml order: shape[0] is the innermost (contiguous) dimension.
  std::vector<int64_t> shape;
  GgmlType type = GgmlType::kF32;
  int64_t num_elements = 0;
  int64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the file lives
};

class GgufFile {
 public:
  // Maps the file at `path` read-only and parses it.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (tests, fuzzing). Takes ownership of `bytes`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }

  // --- metadata ---
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  // Typed getters: NotFound if absent, InvalidArgument naming the key if the
  // stored type does not convert (any unsigned/signed integer width converts
  // when the value fits; float32 and float64 both read as float).
  absl::StatusOr<uint32_t> GetUint32(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt64(std::string_view key) const;
  absl::StatusOr<float> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  std::vector<std::string> Keys() const;

  // --- tensors ---
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  std::string owned_bytes_;      // FromBytes
  void* mapping_ = nullptr;      // Open
  size_t mapping_size_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  absl::flat_hash_map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_GGUF_FILE_H_
