// TANDEM_RETURN_IF_ERROR and TANDEM_ASSIGN_OR_RETURN. abseil 20220623 (Debian
// 12) predates ABSL_RETURN_IF_ERROR; these keep the same shape so they can be
// replaced by the abseil macros later.
//
//   TANDEM_RETURN_IF_ERROR(config.Validate());
//   TANDEM_ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(config));
#ifndef TANDEM_COMMON_STATUS_MACROS_H_
#define TANDEM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_RETURN_IF_ERROR(expr)                     \
  do {                                                   \
    ::absl::Status tandem_status_ = (expr);              \
    if (!tandem_status_.ok()) return tandem_status_;     \
  } while (false)

#define TANDEM_STATUS_CONCAT_INNER(a, b) a##b
#define TANDEM_STATUS_CONCAT(a, b) TANDEM_STATUS_CONCAT_INNER(a, b)

#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_STATUS_CONCAT(tandem_statusor_, __LINE__), lhs, expr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TANDEM_COMMON_STATUS_MACROS_H_
