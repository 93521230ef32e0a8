// Test helpers for the GGUF library: a byte builder for hand-made (and
// deliberately malformed) images, and a tiny random-weight Llama model
// written with GgufWriter.
#ifndef TANDEM_COMMON_GGUF_GGUF_TEST_UTIL_H_
#define TANDEM_COMMON_GGUF_GGUF_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf_writer.h"

namespace tandem::gguf::testing {

// Appends little-endian fields; the caller lays out the file by hand.
class ByteBuilder {
 public:
  ByteBuilder& U8(uint8_t v) { return Raw(&v, 1); }
  ByteBuilder& U16(uint16_t v) { return Raw(&v, 2); }
  ByteBuilder& U32(uint32_t v) { return Raw(&v, 4); }
  ByteBuilder& U64(uint64_t v) { return Raw(&v, 8); }
  ByteBuilder& I64(int64_t v) { return Raw(&v, 8); }
  ByteBuilder& F32(float v) { return Raw(&v, 4); }
  ByteBuilder& F64(double v) { return Raw(&v, 8); }
  ByteBuilder& Str(const std::string& s) {
    U64(s.size());
    bytes_.append(s);
    return *this;
  }
  ByteBuilder& Bytes(const std::string& s) {
    bytes_.append(s);
    return *this;
  }
  // "GGUF", version, tensor count, kv count.
  ByteBuilder& Header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    bytes_.append("GGUF");
    return U32(version).U64(tensors).U64(kvs);
  }
  // Key and value-type tag of one metadata entry.
  ByteBuilder& Key(const std::string& key, uint32_t type) { return Str(key).U32(type); }
  // One tensor directory entry.
  ByteBuilder& TensorInfo(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset);
  // Zero bytes up to the next multiple of `alignment`.
  ByteBuilder& PadTo(size_t alignment);

  size_t size() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  ByteBuilder& Raw(const void* p, size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string bytes_;
};

struct TinyLlama {
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t intermediate = 96;
  int64_t vocab = 40;
  int64_t context = 128;
  GgmlType type = GgmlType::kQ8_0;
  bool tied = true;
  uint32_t seed = 1;
  // Also write tokenizer.ggml.* (tokens "t0".."tN", types, bos).
  bool with_tokenizer = true;
  // Metadata keys to leave out (to test defaults and missing keys).
  std::vector<std::string> omit_keys;
};

// Fills `writer` with the model's metadata and tensors (matrices of
// `type`, norms F32, small deterministic values).
void AddTinyLlama(const TinyLlama& options, GgufWriter* writer);
// The serialized image of AddTinyLlama.
std::string TinyLlamaImage(const TinyLlama& options);

// Deterministic values in [-scale, scale).
std::vector<float> RandomValues(int64_t n, uint32_t seed, float scale = 1.0f);

}  // namespace tandem::gguf::testing

#endif  // TANDEM_COMMON_GGUF_GGUF_TEST_UTIL_H_
