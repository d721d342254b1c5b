// How a process reaches other nodes: CAF's BASP over TCP, or, when the cluster has a
// credential ([cluster] tls_certificate, tls_key, tls_ca_file), over TLS through CAF's OpenSSL
// module with both sides' certificates verified against the cluster CA: a process without a
// certificate of that CA can neither connect to a node nor be connected to. Every publish and
// connect between nodes (shoald, the healer, the shell, `shoal up/down`) goes through here.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <string>

#include "actors/interfaces.hpp"

namespace shoal::actors {

struct tls_files {
  std::string certificate, key, ca_file;  // PEM files; all empty: plain TCP
  bool enabled() const { return !certificate.empty(); }
};

// "" when the files make a credential (each readable PEM, the key matching the certificate,
// the certificate signed by the CA), else what is wrong, naming the file.
std::string check_tls_files(const tls_files& files);

// Before the actor system is made: loads the OpenSSL module with the credential. (Automatic
// connections, which CAF would open without TLS, are off in every shoal config.)
void use_tls(caf::actor_system_config& cfg, const tls_files& files);
bool uses_tls(caf::actor_system& sys);

// Publishes `agent` on host:port (port 0: any); the port bound, or an error.
std::expected<uint16_t, std::string> publish_agent(caf::actor_system& sys, const node_agent_actor& agent,
                                                   const std::string& host, uint16_t port);

// The node agent published at host:port, waiting at most `timeout` (a cut link or a stopped
// process would hold a plain connect for as long as the kernel tries); the error says why,
// with a hint when the other side may want TLS (or not want it).
std::expected<node_agent_actor, std::string> connect_agent(caf::actor_system& sys, const std::string& host,
                                                           uint16_t port, std::chrono::milliseconds timeout);

}  // namespace shoal::actors
