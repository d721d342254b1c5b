#include "actors/cluster_tls.hpp"

#include <dlfcn.h>

#include <memory>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

// CAF 0.17's OpenSSL sessions share one multiplexer thread and never empty that thread's
// OpenSSL error queue before an I/O call. A handshake that fails (a peer without the cluster
// certificate, a plain-TCP connect) leaves its errors there, and the next SSL_read of a healthy
// connection then reads them through SSL_get_error as its own: CAF closes that connection and
// the members on both ends drop each other (measured: one refused shell made an engine node
// lose the gateway; the healer brought it back within a second, and a peer retrying every
// 0.5 s kept the cluster flapping). OpenSSL asks callers to empty the queue before each TLS I/O
// call; these definitions interpose the four calls CAF makes (the executable's symbols come
// before libssl's) and do that, then call libssl's own.
namespace {
template <class Fn>
Fn next_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}
}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = next_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = next_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static const auto real = next_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  static const auto real = next_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}
}

namespace shoal::actors {

namespace {

std::string openssl_error() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += std::string(out.empty() ? "" : "; ") + buf;
  }
  return out.empty() ? "unreadable" : out;
}

// By value: the plain middleman hands out its handle as a temporary.
caf::io::middleman_actor middleman_of(caf::actor_system& sys) {
  if (sys.has_openssl_manager()) return sys.openssl_manager().actor_handle();
  return sys.middleman().actor_handle();
}

}  // namespace

std::string check_tls_files(const tls_files& f) {
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!ctx) return "cannot make a TLS context: " + openssl_error();
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), f.certificate.c_str()) != 1)
    return "tls_certificate " + f.certificate + ": not a readable PEM certificate (" + openssl_error() + ")";
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), f.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return "tls_key " + f.key + ": not a readable PEM private key (" + openssl_error() + ")";
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    return "tls_key " + f.key + " does not belong to tls_certificate " + f.certificate;
  if (SSL_CTX_load_verify_locations(ctx.get(), f.ca_file.c_str(), nullptr) != 1)
    return "tls_ca_file " + f.ca_file + ": not a readable PEM certificate (" + openssl_error() + ")";
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> vctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  X509* cert = SSL_CTX_get0_certificate(ctx.get());
  if (!vctx || !cert || X509_STORE_CTX_init(vctx.get(), SSL_CTX_get_cert_store(ctx.get()), cert, nullptr) != 1)
    return "cannot check tls_certificate " + f.certificate + ": " + openssl_error();
  if (X509_verify_cert(vctx.get()) != 1)
    return "tls_certificate " + f.certificate + " is not signed by tls_ca_file " + f.ca_file + " (" +
           X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx.get())) + ")";
  return {};
}

void use_tls(caf::actor_system_config& cfg, const tls_files& f) {
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = f.certificate;
  cfg.openssl_key = f.key;
  cfg.openssl_cafile = f.ca_file;
}

bool uses_tls(caf::actor_system& sys) { return sys.has_openssl_manager(); }

std::expected<uint16_t, std::string> publish_agent(caf::actor_system& sys, const node_agent_actor& agent,
                                                   const std::string& host, uint16_t port) {
  caf::scoped_actor self{sys};
  std::expected<uint16_t, std::string> out = std::unexpected("no answer from the middleman");
  self->request(middleman_of(sys), caf::infinite, caf::publish_atom::value, port,
                caf::actor_cast<caf::strong_actor_ptr>(agent), sys.message_types(agent), host, true)
    .receive([&](uint16_t bound) { out = bound; }, [&](caf::error& e) { out = std::unexpected(sys.render(e)); });
  return out;
}

std::expected<node_agent_actor, std::string> connect_agent(caf::actor_system& sys, const std::string& host,
                                                           uint16_t port, std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys};
  std::expected<node_agent_actor, std::string> out = std::unexpected("no answer");
  self->request(middleman_of(sys), timeout, caf::connect_atom::value, host, port)
    .receive(
      [&](caf::node_id&, caf::strong_actor_ptr& p, std::set<std::string>&) {
        if (p) out = caf::actor_cast<node_agent_actor>(p);
        else out = std::unexpected("nothing is published there");
      },
      [&](caf::error& e) {
        std::string why = sys.render(e);
        // A TLS handshake refused either way ends the connection before BASP's handshake.
        if (e == caf::sec::disconnect_during_handshake || e == caf::sec::cannot_connect_to_node ||
            e == caf::sec::request_timeout)
          why += uses_tls(sys) ? " (with cluster TLS on here: the other side may run without TLS, or not accept this "
                                 "node's certificate, or this node may not accept its certificate)"
                               : " (this node runs without cluster TLS: the other side may require it)";
        out = std::unexpected(why);
      });
  return out;
}

}  // namespace shoal::actors
