// Scalar vocabulary shared by every tandem component. Request ids on the wire
// are integers assigned by the scheduler (the client's id string stays in the
// frontend); block ids index the KV cache that the scheduler allocates and the
// workers lay out in memory.
#ifndef TANDEM_COMMON_TYPES_H_
#define TANDEM_COMMON_TYPES_H_

#include <cstdint>

namespace tandem {

using TokenId = int32_t;
using RequestId = int64_t;
using BlockId = int32_t;
// Sequence number of a scheduled step; 0 means "no step".
using StepSeq = uint64_t;

}  // namespace tandem

#endif  // TANDEM_COMMON_TYPES_H_
