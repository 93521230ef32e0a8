#include "common/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::gguf {
namespace {

// Debian's abseil has its own string_view, which std::string_view does not
// convert to; the public API takes std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint64_t kDefaultAlignment = 32;
// A larger alignment is surely corruption (and rounding up to it could
// overflow).
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;
constexpr uint32_t kMaxDims = 4;
// The least bytes one directory entry can take: used to refuse counts the
// rest of the file could not possibly hold, before reserving anything.
constexpr size_t kMinKvBytes = 8 + 1 + 4 + 1;                  // key length, 1-byte key, type, u8
constexpr size_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, 1 dim, type, offset
// Containers grow past this only as entries actually parse, so a corrupt
// count that passes the checks above still costs no up-front allocation.
constexpr uint64_t kMaxReserve = 4096;

absl::string_view ValueTypeName(uint32_t type) {
  static constexpr absl::string_view kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                                 "bool",  "string", "array",  "uint64", "int64",  "float64"};
  if (type < sizeof(kNames) / sizeof(kNames[0])) return kNames[type];
  return "unknown";
}

std::string DescribeType(const GgufValue& v) {
  if (v.type == GgufValueType::kArray) {
    return absl::StrCat("array of ", ValueTypeName(static_cast<uint32_t>(v.array_type)));
  }
  return std::string(ValueTypeName(static_cast<uint32_t>(v.type)));
}

// Bytes one array element takes at the least (strings: their length field).
size_t MinElementBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    default: return 8;
  }
}

// A bounds-checked cursor over the file image. Every read checks the bytes
// remain first, so no input can make the parser read past the end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what) {
    if (remaining() < sizeof(T)) return Truncated(sizeof(T), what);
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, absl::string_view what) {
    const size_t at = pos_;
    uint64_t length = 0;
    TANDEM_RETURN_IF_ERROR(Read(&length, what));
    if (length > remaining()) {
      return absl::DataLossError(absl::StrCat(what, ": string length ", length, " at offset ", at,
                                              " runs past the end of the file (", remaining(), " bytes left)"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

 private:
  absl::Status Truncated(size_t need, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("truncated file: ", what, " needs ", need, " bytes at offset ", pos_,
                                            " but only ", remaining(), " remain"));
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Reads a T from the file and stores it as the variant's Stored.
template <typename Stored, typename T>
absl::Status ReadScalar(Reader& r, GgufValue* v, absl::string_view what) {
  T x{};
  TANDEM_RETURN_IF_ERROR(r.Read(&x, what));
  v->value = static_cast<Stored>(x);
  return absl::OkStatus();
}

absl::Status ReadValue(Reader& r, uint32_t type, GgufValue* v, absl::string_view what);

absl::Status ReadBool(Reader& r, bool* out, absl::string_view what) {
  const size_t at = r.pos();
  uint8_t byte = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&byte, what));
  if (byte > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bool byte at offset ", at, " is ", byte, " (must be 0 or 1)"));
  }
  *out = byte == 1;
  return absl::OkStatus();
}

// Reads one array element of integer type `type` into *out.
absl::Status ReadIntElement(Reader& r, GgufValueType type, int64_t* out, absl::string_view what) {
  const size_t at = r.pos();
  GgufValue v;
  TANDEM_RETURN_IF_ERROR(ReadValue(r, static_cast<uint32_t>(type), &v, what));
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) {
    // Arrays keep int64; a uint64 element above its range would read back
    // wrong, so it is refused rather than wrapped.
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": uint64 element ", *u, " at offset ", at, " does not fit int64"));
    }
    *out = static_cast<int64_t>(*u);
  } else {
    *out = std::get<int64_t>(v.value);
  }
  return absl::OkStatus();
}

// Appends `count` elements read by `read_one`. The vector grows with what
// actually parses rather than being sized from the (checked, but possibly
// corrupt) count up front.
template <typename T, typename ReadOne>
absl::Status ReadElements(uint64_t count, std::vector<T>* items, ReadOne read_one) {
  items->reserve(static_cast<size_t>(std::min<uint64_t>(count, kMaxReserve)));
  for (uint64_t i = 0; i < count; ++i) {
    T item{};
    TANDEM_RETURN_IF_ERROR(read_one(&item));
    items->push_back(std::move(item));
  }
  return absl::OkStatus();
}

absl::Status ReadArray(Reader& r, GgufValue* v, absl::string_view what) {
  const size_t at = r.pos();
  uint32_t elem_type = 0;
  uint64_t count = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&elem_type, what));
  if (elem_type == static_cast<uint32_t>(GgufValueType::kArray)) {
    return absl::UnimplementedError(
        absl::StrCat(what, " is an array of arrays (offset ", at, "), which tandem does not support"));
  }
  if (elem_type > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown array element type ", elem_type, " at offset ", at));
  }
  TANDEM_RETURN_IF_ERROR(r.Read(&count, what));
  const auto type = static_cast<GgufValueType>(elem_type);
  if (count > r.remaining() / MinElementBytes(type)) {
    return absl::DataLossError(absl::StrCat(what, ": array count ", count, " at offset ", at + 4,
                                            " is more than the rest of the file could hold (", r.remaining(),
                                            " bytes left)"));
  }
  v->array_type = type;
  switch (type) {
    case GgufValueType::kString: {
      std::vector<std::string> items;
      TANDEM_RETURN_IF_ERROR(ReadElements(count, &items, [&](std::string* item) { return r.ReadString(item, what); }));
      v->value = std::move(items);
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      std::vector<bool> items;
      TANDEM_RETURN_IF_ERROR(ReadElements(count, &items, [&](bool* item) { return ReadBool(r, item, what); }));
      v->value = std::move(items);
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64: {
      std::vector<double> items;
      TANDEM_RETURN_IF_ERROR(ReadElements(count, &items, [&](double* item) {
        if (type == GgufValueType::kFloat64) return r.Read(item, what);
        float f = 0;
        TANDEM_RETURN_IF_ERROR(r.Read(&f, what));
        *item = f;
        return absl::OkStatus();
      }));
      v->value = std::move(items);
      return absl::OkStatus();
    }
    default: {
      std::vector<int64_t> items;
      TANDEM_RETURN_IF_ERROR(
          ReadElements(count, &items, [&](int64_t* item) { return ReadIntElement(r, type, item, what); }));
      v->value = std::move(items);
      return absl::OkStatus();
    }
  }
}

absl::Status ReadValue(Reader& r, uint32_t type, GgufValue* v, absl::string_view what) {
  if (type > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown value type ", type, " at offset ", r.pos() - sizeof(uint32_t)));
  }
  v->type = static_cast<GgufValueType>(type);
  switch (v->type) {
    case GgufValueType::kUint8: return ReadScalar<uint64_t, uint8_t>(r, v, what);
    case GgufValueType::kInt8: return ReadScalar<int64_t, int8_t>(r, v, what);
    case GgufValueType::kUint16: return ReadScalar<uint64_t, uint16_t>(r, v, what);
    case GgufValueType::kInt16: return ReadScalar<int64_t, int16_t>(r, v, what);
    case GgufValueType::kUint32: return ReadScalar<uint64_t, uint32_t>(r, v, what);
    case GgufValueType::kInt32: return ReadScalar<int64_t, int32_t>(r, v, what);
    case GgufValueType::kUint64: return ReadScalar<uint64_t, uint64_t>(r, v, what);
    case GgufValueType::kInt64: return ReadScalar<int64_t, int64_t>(r, v, what);
    case GgufValueType::kFloat32: return ReadScalar<double, float>(r, v, what);
    case GgufValueType::kFloat64: return ReadScalar<double, double>(r, v, what);
    case GgufValueType::kBool: {
      bool b = false;
      TANDEM_RETURN_IF_ERROR(ReadBool(r, &b, what));
      v->value = b;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      std::string s;
      TANDEM_RETURN_IF_ERROR(r.ReadString(&s, what));
      v->value = std::move(s);
      return absl::OkStatus();
    }
    case GgufValueType::kArray: return ReadArray(r, v, what);
  }
  return absl::InternalError("unreachable");
}

absl::Status ReadHeader(Reader& r, uint32_t* version, uint64_t* tensor_count, uint64_t* kv_count) {
  char magic[4] = {0, 0, 0, 0};
  if (r.remaining() < sizeof(magic)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a GGUF file: ", r.remaining(), " bytes is too short for the \"GGUF\" magic"));
  }
  TANDEM_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (std::memcmp(magic, "GGUF", sizeof(magic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a GGUF file: the first bytes are \"",
                                                   absl::CHexEscape(absl::string_view(magic, sizeof(magic))),
                                                   "\", not \"GGUF\" (offset 0)"));
  }
  TANDEM_RETURN_IF_ERROR(r.Read(version, "version"));
  if (*version == 1) {
    return absl::UnimplementedError(
        "GGUF version 1 (32-bit counts) is not supported; convert the model again with a current llama.cpp");
  }
  if (*version != 2 && *version != 3) {
    const bool swapped = *version == 0x02000000u || *version == 0x03000000u;
    return absl::UnimplementedError(absl::StrCat("GGUF version ", *version, " at offset 4 is not supported",
                                                 swapped ? " (this looks like a big-endian file)" : "",
                                                 "; tandem reads versions 2 and 3"));
  }
  TANDEM_RETURN_IF_ERROR(r.Read(tensor_count, "tensor count"));
  TANDEM_RETURN_IF_ERROR(r.Read(kv_count, "metadata count"));
  if (*kv_count > r.remaining() / kMinKvBytes) {
    return absl::DataLossError(absl::StrCat("metadata count ", *kv_count, " at offset 16 is more than the file's ",
                                            r.pos() + r.remaining(), " bytes could hold (truncated or corrupt)"));
  }
  if (*tensor_count > r.remaining() / kMinTensorInfoBytes) {
    return absl::DataLossError(absl::StrCat("tensor count ", *tensor_count, " at offset 8 is more than the file's ",
                                            r.pos() + r.remaining(), " bytes could hold (truncated or corrupt)"));
  }
  return absl::OkStatus();
}

absl::Status ReadMetadata(Reader& r, uint64_t kv_count, absl::flat_hash_map<std::string, GgufValue>* metadata) {
  metadata->reserve(static_cast<size_t>(std::min<uint64_t>(kv_count, kMaxReserve)));
  for (uint64_t i = 0; i < kv_count; ++i) {
    const size_t at = r.pos();
    std::string key;
    TANDEM_RETURN_IF_ERROR(r.ReadString(&key, absl::StrCat("key of metadata entry ", i)));
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("metadata entry ", i, " at offset ", at, " has an empty key"));
    }
    const std::string what = absl::StrCat("metadata key '", key, "'");
    uint32_t type = 0;
    TANDEM_RETURN_IF_ERROR(r.Read(&type, what));
    GgufValue value;
    TANDEM_RETURN_IF_ERROR(ReadValue(r, type, &value, what));
    if (!metadata->try_emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate metadata key '", key, "' at offset ", at));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReadAlignment(const GgufFile& file) {
  const GgufValue* v = file.Find("general.alignment");
  if (v == nullptr) return kDefaultAlignment;
  uint64_t alignment = 0;  // a negative signed value stays 0 and is refused below
  if (const uint64_t* u = std::get_if<uint64_t>(&v->value)) {
    alignment = *u;
  } else if (const int64_t* s = std::get_if<int64_t>(&v->value)) {
    if (*s > 0) alignment = static_cast<uint64_t>(*s);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("general.alignment has type ", DescribeType(*v), "; expected an integer"));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("general.alignment must be a power of two up to ", kMaxAlignment, ", got ", alignment));
  }
  return alignment;
}

// Reads one tensor directory entry; checks everything that needs no file
// size (dims, type, sizes, offset alignment).
absl::Status ReadTensorInfo(Reader& r, uint64_t index, uint64_t alignment, GgufTensor* t, uint64_t* offset) {
  const size_t at = r.pos();
  TANDEM_RETURN_IF_ERROR(r.ReadString(&t->name, absl::StrCat("name of tensor ", index)));
  if (t->name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " at offset ", at, " has an empty name"));
  }
  const std::string what = absl::StrCat("tensor ", t->name);
  uint32_t n_dims = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&n_dims, what));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has n_dims ", n_dims, " at offset ", r.pos() - 4, "; tandem supports 1 to ", kMaxDims));
  }
  int64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t dim = 0;
    TANDEM_RETURN_IF_ERROR(r.Read(&dim, what));
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has dimension ", d, " = ", static_cast<int64_t>(dim),
                                                     " at offset ", r.pos() - 8, "; dimensions must be positive"));
    }
    if (static_cast<int64_t>(dim) > std::numeric_limits<int64_t>::max() / elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": element count overflows at dimension ", d));
    }
    t->shape.push_back(static_cast<int64_t>(dim));
    elements *= static_cast<int64_t>(dim);
  }
  uint32_t type = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&type, what));
  if (!IsSupportedType(type)) {
    return absl::UnimplementedError(absl::StrCat(what, " has type ", Av(GgmlTypeName(type)), " (", type,
                                                 "), which tandem does not support (it reads F32, F16, BF16, "
                                                 "Q8_0, Q4_0 and Q4_1)"));
  }
  t->type = static_cast<GgmlType>(type);
  const int64_t block = BlockElements(t->type);
  if (t->shape[0] % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has rows of ", t->shape[0],
                                                   " elements, not a multiple of the ", Av(GgmlTypeName(type)),
                                                   " block size ", block));
  }
  if (elements / block > std::numeric_limits<int64_t>::max() / BlockBytes(t->type)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": byte size overflows"));
  }
  t->num_elements = elements;
  t->num_bytes = elements / block * BlockBytes(t->type);
  TANDEM_RETURN_IF_ERROR(r.Read(offset, what));
  if (*offset % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has data offset ", *offset, " (at offset ", r.pos() - 8,
                                                   "), not a multiple of the alignment ", alignment));
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(int error, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(message);
    default: return absl::UnavailableError(message);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoError(error, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {  // mmap refuses length 0; Parse() reports the empty file
    void* mapping = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return ErrnoError(error, absl::StrCat("cannot map ", path));
    }
    file->mapping_ = mapping;
    file->mapping_size_ = file->size_;
    file->data_ = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);  // the mapping keeps the file open
  if (absl::Status s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->owned_bytes_ = std::move(bytes);
  file->data_ = reinterpret_cast<const uint8_t*>(file->owned_bytes_.data());
  file->size_ = file->owned_bytes_.size();
  TANDEM_RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::Status GgufFile::Parse() {
  Reader r(data_, size_);
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  TANDEM_RETURN_IF_ERROR(ReadHeader(r, &version_, &tensor_count, &kv_count));
  TANDEM_RETURN_IF_ERROR(ReadMetadata(r, kv_count, &metadata_));
  TANDEM_ASSIGN_OR_RETURN(const uint64_t alignment, ReadAlignment(*this));

  const size_t reserve = static_cast<size_t>(std::min<uint64_t>(tensor_count, kMaxReserve));
  std::vector<uint64_t> offsets;
  offsets.reserve(reserve);
  tensors_.reserve(reserve);
  tensor_index_.reserve(reserve);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    const size_t at = r.pos();
    GgufTensor t;
    uint64_t offset = 0;
    TANDEM_RETURN_IF_ERROR(ReadTensorInfo(r, i, alignment, &t, &offset));
    if (!tensor_index_.try_emplace(t.name, tensors_.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", t.name, "' at offset ", at));
    }
    tensors_.push_back(std::move(t));
    offsets.push_back(offset);
  }
  if (tensor_count == 0) return absl::OkStatus();

  // The data section starts at the next multiple of the alignment after the
  // directory; tensor offsets are relative to it.
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  if (data_start > size_) {
    return absl::DataLossError(absl::StrCat("truncated file: the tensor data section would start at offset ",
                                            data_start, " but the file has ", size_, " bytes"));
  }
  const uint64_t available = size_ - data_start;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor& t = tensors_[i];
    const uint64_t bytes = static_cast<uint64_t>(t.num_bytes);
    if (offsets[i] > available || bytes > available - offsets[i]) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, " (", bytes, " bytes at data offset ", offsets[i],
                                              " in the data section at offset ", data_start,
                                              ") extends past the end of the file (", size_, " bytes)"));
    }
    t.data = data_ + data_start + offsets[i];
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(Av(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

absl::StatusOr<const GgufValue*> FindOrError(const GgufFile& file, absl::string_view key) {
  const GgufValue* v = file.Find(std::string_view(key.data(), key.size()));
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("metadata key '", key, "' is missing"));
  return v;
}

absl::Status WrongType(absl::string_view key, const GgufValue& v, absl::string_view wanted) {
  return absl::InvalidArgumentError(
      absl::StrCat("metadata key '", key, "' has type ", DescribeType(v), "; expected ", wanted));
}

}  // namespace

absl::StatusOr<uint32_t> GgufFile::GetUint32(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const uint64_t* u = std::get_if<uint64_t>(&v->value)) {
    if (*u <= std::numeric_limits<uint32_t>::max()) return static_cast<uint32_t>(*u);
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", k, "' = ", *u, " does not fit uint32"));
  }
  if (const int64_t* s = std::get_if<int64_t>(&v->value)) {
    if (*s >= 0 && *s <= std::numeric_limits<uint32_t>::max()) return static_cast<uint32_t>(*s);
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", k, "' = ", *s, " does not fit uint32"));
  }
  return WrongType(k, *v, "an integer");
}

absl::StatusOr<int64_t> GgufFile::GetInt64(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const uint64_t* u = std::get_if<uint64_t>(&v->value)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(*u);
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", k, "' = ", *u, " does not fit int64"));
  }
  if (const int64_t* s = std::get_if<int64_t>(&v->value)) return *s;
  return WrongType(k, *v, "an integer");
}

absl::StatusOr<float> GgufFile::GetFloat(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const double* d = std::get_if<double>(&v->value)) return static_cast<float>(*d);
  // An integer-typed value reads exactly as the number it is.
  if (const uint64_t* u = std::get_if<uint64_t>(&v->value)) return static_cast<float>(*u);
  if (const int64_t* s = std::get_if<int64_t>(&v->value)) return static_cast<float>(*s);
  return WrongType(k, *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const bool* b = std::get_if<bool>(&v->value)) return *b;
  return WrongType(k, *v, "a bool");
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const std::string* s = std::get_if<std::string>(&v->value)) return *s;
  return WrongType(k, *v, "a string");
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const auto* a = std::get_if<std::vector<std::string>>(&v->value)) return *a;
  return WrongType(k, *v, "an array of string");
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const absl::string_view k = Av(key);
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(*this, k));
  if (const auto* a = std::get_if<std::vector<int64_t>>(&v->value)) return *a;
  return WrongType(k, *v, "an array of integers");
}

std::vector<std::string> GgufFile::Keys() const {
  std::vector<std::string> keys;
  keys.reserve(metadata_.size());
  for (const auto& [key, value] : metadata_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(Av(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tandem::gguf
