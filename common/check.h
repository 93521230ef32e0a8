// TANDEM_CHECK / TANDEM_DCHECK: crash with a message on a broken invariant.
// Use them for programmer errors only; anything a peer, a file, a user or the
// GPU can cause returns an absl::Status instead (scheduler/README.md §9,
// convention 2).
//
//   TANDEM_CHECK(ph >= 0) << "placeholder underflow for request " << id;
//   TANDEM_DCHECK(block < num_blocks);   // hot path: compiled out with NDEBUG
#ifndef TANDEM_COMMON_CHECK_H_
#define TANDEM_COMMON_CHECK_H_

#include <sstream>

namespace tandem::internal {

// Collects the streamed message and aborts the process in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem::internal

#define TANDEM_CHECK(condition)                   \
  (condition) ? (void)0                           \
              : ::tandem::internal::Voidify() &   \
                    ::tandem::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define TANDEM_CHECK_OK(status_expr)                                                  \
  do {                                                                                \
    const auto& tandem_check_ok_status = (status_expr);                               \
    TANDEM_CHECK(tandem_check_ok_status.ok()) << tandem_check_ok_status.ToString();   \
  } while (false)

#ifdef NDEBUG
#define TANDEM_DCHECK(condition) \
  while (false) TANDEM_CHECK(condition)
#else
#define TANDEM_DCHECK(condition) TANDEM_CHECK(condition)
#endif

#endif  // TANDEM_COMMON_CHECK_H_
