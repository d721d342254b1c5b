// The metric families every shoal process exposes (GET /metrics): the gateway's and each
// node's, declared once at start-up in a runtime/base/metrics.hpp registry.
#pragma once

#include "runtime/base/metrics.hpp"

namespace shoal::runtime {

// The gateway's metrics (names below); label `model` unless noted.
struct gateway_metrics {
  counter requests;           // shoal_requests_total{status}: finished HTTP requests by status code
  counter prompt_tokens;      // shoal_prompt_tokens_total
  counter generated_tokens;   // shoal_generation_tokens_total
  counter cached_tokens;      // shoal_prefix_cache_hit_tokens_total: prompt tokens from the cache
  histogram ttft;             // shoal_time_to_first_token_seconds
  histogram tpot;             // shoal_time_per_output_token_seconds
  gauge queue_depth;          // shoal_queue_depth (no label): requests in flight at the gateway
};
gateway_metrics add_gateway_metrics(metrics_registry& r);

// Every node's own metrics (node.metrics_listen), label `actor`: "rank<i>" for engine ranks,
// "storage<i>" for storage nodes. Step time and tokens per step are ratios of the counters
// (rate(step_seconds) / rate(steps), rate(prefill + decode tokens) / rate(steps)).
struct node_metrics {
  gauge running, waiting, waiting_for_remote;  // shoal_engine_requests_{running,waiting,waiting_for_remote}
  gauge blocks_used, blocks_free;              // shoal_engine_kv_blocks_{used,free}
  counter prefix_queries;                      // shoal_engine_prefix_queries_total: admissions that looked up the cache
  counter hit_tokens, storage_hit_tokens;      // shoal_engine_prefix_hit_tokens_total, …_storage_hit_tokens_total
  counter steps, step_seconds;                 // shoal_engine_steps_total, shoal_engine_step_seconds_total
  counter prefill_tokens, decode_tokens;       // shoal_engine_{prefill,decode}_tokens_total
  counter spec_verified, spec_accepted;        // shoal_engine_spec_{verified,accepted}_total: DSpark drafts
  counter images_encoded, image_cache_hits;    // shoal_engine_images_encoded_total, …_image_cache_hits_total
  // Decode side of a handoff: shoal_engine_handoff_failures_total (recomputed instead of read),
  // and of those …_handoff_timeouts_total (the lender slow or gone) and …_handoff_corrupt_total
  // (its bytes failed their checksum).
  counter handoff_failures, handoff_timeouts, handoff_corrupt;
  // KV blocks of another format: handoffs refused (shoal_engine_handoffs_refused_format_total)
  // and storage reads that stopped at one (shoal_engine_storage_format_misses_total).
  counter handoffs_refused_format, storage_format_misses;
  gauge storage_usage, storage_capacity, storage_chunks;  // shoal_storage_{usage,capacity}_bytes, shoal_storage_chunks
  counter storage_puts, storage_gets, storage_gc_evicted, storage_ttl_expired;
  counter storage_put_seconds, storage_get_seconds, storage_get_hits;  // latency: rate(seconds) / rate(count)
  // Gateway nodes: shoal_prefill_balancer_placements_total{engine}, …_tier_placements_total{tier},
  // shoal_decode_balancer_placements_total{engine}, shoal_decode_balancer_balance_ratio{window}.
  counter prefill_placements, prefill_tier_placements, decode_placements;
  gauge decode_balance;
  // Expert-parallel engine nodes with partitioned weights (runtime/ep/expert_residency.hpp):
  // shoal_engine_experts_resident{actor="node"} (MoE layer, routed expert) weights in memory,
  // shoal_engine_experts_resident_bytes their bytes.
  gauge experts_resident, experts_resident_bytes;
  // shoal_ep_group_ranks{actor="node"}: ranks in the expert-parallel group this process's
  // ranks are in now (fewer than configured while a lost member is out).
  gauge ep_group_ranks;
  // shoal_ep_frames_sent_total{path="bulk"|"inline"}: expert-parallel frames this process's
  // ranks sent over the bulk transport / inside CAF messages.
  counter ep_frames_sent;
  // shoal_ep_expert_bytes_read_total{source="memory"|"holder"|"checkpoint"}: routed-expert
  // weights a rank of this process adopted that another rank here held already (nothing read) /
  // read from another process over the bulk transport / from its checkpoint (group starts
  // included); shoal_ep_expert_read_failures_total: reads from a holder that failed
  // (the checkpoint gave those experts).
  counter ep_expert_bytes_read, ep_expert_read_failures;
  // shoal_transport_reads_total{path="shm"|"network"}: ranges the engine ranks' bulk transport
  // read through shm (owner on this host) / through the network provider, with
  // engine.transport = "auto" or "shm+<provider>".
  counter transport_reads;
  // process_resident_memory_bytes: this process's resident set (every role).
  gauge process_resident;
};
node_metrics add_node_metrics(metrics_registry& r);

}  // namespace shoal::runtime
