// GrpcGenerateService: the scheduler's gRPC API for programmatic clients
// (proto/tandem/v1/generate_service.proto). Generate tokenizes on the gRPC
// thread, submits to the ServingEngine and streams the tokens back as they
// come, with the text they complete; a client that cancels aborts its
// request. Abort and Health are unary.
//
// Thread-safe: reactions only translate and enqueue.
#ifndef TANDEM_SCHEDULER_SERVER_GRPC_GRPC_GENERATE_SERVICE_H_
#define TANDEM_SCHEDULER_SERVER_GRPC_GRPC_GENERATE_SERVICE_H_

#include <atomic>

#include "common/tokenizer/tokenizer.h"
#include "scheduler/wire/worker_group.h"
#include "scheduler/server/serving_engine.h"
#include "tandem/v1/generate_service.grpc.pb.h"

namespace tandem::scheduler {

class GrpcGenerateService final : public v1::Generate::CallbackService {
 public:
  // Does not take ownership; all must outlive the service.
  GrpcGenerateService(ServingEngine* engine, const Tokenizer* tokenizer, const WorkerGroup* group)
      : engine_(engine), tokenizer_(tokenizer), group_(group) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                          const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context, const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;

 private:
  ServingEngine* const engine_;
  const Tokenizer* const tokenizer_;
  const WorkerGroup* const group_;
  std::atomic<int64_t> next_anonymous_{1};
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_GRPC_GENERATE_SERVICE_H_
