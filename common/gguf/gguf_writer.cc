#include "common/gguf/gguf_writer.h"

#include "common/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem::gguf {
namespace {

constexpr uint32_t kVersion = 3;
constexpr size_t kAlignment = 32;  // GGUF's default; we never write general.alignment

// Value type tags (GgufValueType in gguf_file.h; not included so the writer
// stays independent of the reader).
constexpr uint32_t kTypeUint32 = 4;
constexpr uint32_t kTypeInt32 = 5;
constexpr uint32_t kTypeFloat32 = 6;
constexpr uint32_t kTypeBool = 7;
constexpr uint32_t kTypeString = 8;
constexpr uint32_t kTypeArray = 9;

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void AppendString(std::string* out, const std::string& s) {
  Append<uint64_t>(out, s.size());
  out->append(s);
}

void Pad(std::string* out) { out->resize((out->size() + kAlignment - 1) / kAlignment * kAlignment, '\0'); }

// A second Set of the same key replaces the value in place: the reader
// refuses duplicate keys. (A template so it can take the private Entry.)
template <typename EntryT>
void SetEntry(std::vector<EntryT>* entries, const std::string& key, std::string encoded) {
  for (EntryT& entry : *entries) {
    if (entry.key == key) {
      entry.encoded = std::move(encoded);
      return;
    }
  }
  entries->push_back(EntryT{key, std::move(encoded)});
}

}  // namespace

void GgufWriter::SetUint32(const std::string& key, uint32_t value) {
  std::string e;
  Append(&e, kTypeUint32);
  Append(&e, value);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetInt32(const std::string& key, int32_t value) {
  std::string e;
  Append(&e, kTypeInt32);
  Append(&e, value);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetFloat32(const std::string& key, float value) {
  std::string e;
  Append(&e, kTypeFloat32);
  Append(&e, value);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetBool(const std::string& key, bool value) {
  std::string e;
  Append(&e, kTypeBool);
  Append<uint8_t>(&e, value ? 1 : 0);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetString(const std::string& key, const std::string& value) {
  std::string e;
  Append(&e, kTypeString);
  AppendString(&e, value);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& values) {
  std::string e;
  Append(&e, kTypeArray);
  Append(&e, kTypeString);
  Append<uint64_t>(&e, values.size());
  for (const std::string& v : values) AppendString(&e, v);
  SetEntry(&entries_, key, std::move(e));
}

void GgufWriter::SetInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  std::string e;
  Append(&e, kTypeArray);
  Append(&e, kTypeInt32);
  Append<uint64_t>(&e, values.size());
  for (int32_t v : values) Append(&e, v);
  SetEntry(&entries_, key, std::move(e));
}

absl::Status GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                                   absl::Span<const float> values) {
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  for (const Tensor& t : tensors_) {
    if (t.name == name) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " was already added"));
  }
  if (!IsSupportedType(static_cast<uint32_t>(type))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": unsupported type ", static_cast<uint32_t>(type)));
  }
  if (shape.empty() || shape.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has ", shape.size(), " dimensions; 1 to 4 allowed"));
  }
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d <= 0 || d > std::numeric_limits<int64_t>::max() / elements) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has a bad dimension ", d));
    }
    elements *= d;
  }
  if (static_cast<int64_t>(values.size()) != elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has ", elements, " elements but ", values.size(), " values were given"));
  }
  if (shape[0] % BlockElements(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": rows of ", shape[0],
                                                   " elements are not whole blocks of ", BlockElements(type), " for ",
                                                   std::string(GgmlTypeName(static_cast<uint32_t>(type)))));
  }
  Tensor t{name, shape, type, std::string()};
  t.bytes.resize(static_cast<size_t>(RowBytes(type, elements)));
  // Rows are whole blocks, so the tensor quantizes as one long row.
  if (absl::Status s = QuantizeRow(type, values.data(), t.bytes.data(), elements); !s.ok()) return s;
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

std::string GgufWriter::Serialize() const {
  std::string out;
  out.append("GGUF", 4);
  Append(&out, kVersion);
  Append<uint64_t>(&out, tensors_.size());
  Append<uint64_t>(&out, entries_.size());
  for (const Entry& entry : entries_) {
    AppendString(&out, entry.key);
    out.append(entry.encoded);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    AppendString(&out, t.name);
    Append<uint32_t>(&out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Append<uint64_t>(&out, static_cast<uint64_t>(d));
    Append<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Append<uint64_t>(&out, offset);
    offset += (t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  if (!tensors_.empty()) Pad(&out);
  for (const Tensor& t : tensors_) {
    out.append(t.bytes);
    Pad(&out);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  return WriteFileAtomically(path, Serialize());
}

}  // namespace tandem::gguf
