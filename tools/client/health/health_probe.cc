// tandem-health-probe: asks a gRPC server's standard health service
// (grpc.health.v1.Health/Check) what Kubernetes' `grpc:` probe asks, and
// exits 0 when the answer is SERVING, 1 for any other answer, 2 when there
// is no answer (nothing listening, no health service, the deadline passed).
// Prints the status. For tests, images and people; the kubelet needs it not.
//
//   tandem-health-probe --addr 127.0.0.1:50051 [--service ready] [--timeout 2]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/flags.h"
#include "tools/client/health/health.grpc.pb.h"

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:50051";
  std::string service;
  double timeout = 2;
  tandem::FlagParser flags("tandem-health-probe",
                           "Asks a gRPC server's grpc.health.v1 service for a service's status; exits 0 when\n"
                           "SERVING, 1 otherwise, 2 without an answer.");
  flags.AddString("addr", &addr, "the server's HOST:PORT");
  flags.AddString("service", &service, "the service name to ask about (default: \"\", the whole server)");
  flags.AddDouble("timeout", &timeout, "seconds to wait for the answer");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::printf("%s service '%s': no answer: %s\n", addr.c_str(), service.c_str(), status.error_message().c_str());
    return 2;
  }
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s service '%s': %s\n", addr.c_str(), service.c_str(), name.c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}
