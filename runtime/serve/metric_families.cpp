#include "runtime/serve/metric_families.hpp"

#include <string>

namespace shoal::runtime {

gateway_metrics add_gateway_metrics(metrics_registry& r) {
  return {
      r.add_counter("shoal_requests_total", "Finished HTTP requests by status code.", "status"),
      r.add_counter("shoal_prompt_tokens_total", "Prompt tokens of admitted requests.", "model"),
      r.add_counter("shoal_generation_tokens_total", "Generated tokens.", "model"),
      r.add_counter("shoal_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", "model"),
      r.add_histogram("shoal_time_to_first_token_seconds", "Time from request arrival to the first token.",
                      latency_buckets_seconds(), "model"),
      r.add_histogram("shoal_time_per_output_token_seconds", "Mean time between output tokens of a request.",
                      latency_buckets_seconds(), "model"),
      r.add_gauge("shoal_queue_depth", "Requests in flight at the gateway (admitted, not finished)."),
  };
}

node_metrics add_node_metrics(metrics_registry& r) {
  const std::string a = "actor";
  return {
      r.add_gauge("shoal_engine_requests_running", "Requests an engine rank is computing.", a),
      r.add_gauge("shoal_engine_requests_waiting", "Requests queued at an engine rank.", a),
      r.add_gauge("shoal_engine_requests_waiting_for_remote", "Requests waiting for remote KV or an SWA slot.", a),
      r.add_gauge("shoal_engine_kv_blocks_used", "KV cache blocks in use or cached.", a),
      r.add_gauge("shoal_engine_kv_blocks_free", "KV cache blocks free.", a),
      r.add_counter("shoal_engine_prefix_queries_total", "Admissions that looked up the prefix cache.", a),
      r.add_counter("shoal_engine_prefix_hit_tokens_total", "Prompt tokens served from the prefix cache (local and storage).", a),
      r.add_counter("shoal_engine_storage_hit_tokens_total", "Prompt tokens read from the KV storage cluster.", a),
      r.add_counter("shoal_engine_steps_total", "Engine steps.", a),
      r.add_counter("shoal_engine_step_seconds_total", "Seconds the engine spent in forward passes.", a),
      r.add_counter("shoal_engine_prefill_tokens_total", "Prompt tokens computed.", a),
      r.add_counter("shoal_engine_decode_tokens_total", "Tokens decoded.", a),
      r.add_counter("shoal_engine_spec_verified_total", "DSpark drafts the target model verified.", a),
      r.add_counter("shoal_engine_spec_accepted_total", "Of those, drafts accepted (emitted as output).", a),
      r.add_counter("shoal_engine_images_encoded_total", "Images run through the vision encoder.", a),
      r.add_counter("shoal_engine_image_cache_hits_total", "Images whose encoder rows came from the embedding cache.", a),
      r.add_counter("shoal_engine_handoff_failures_total", "Handoffs a decode engine recomputed instead of reading.", a),
      r.add_counter("shoal_engine_handoff_timeouts_total", "Of those, handoffs whose reads timed out (lender slow or gone).", a),
      r.add_counter("shoal_engine_handoff_corrupt_total", "Of those, handoffs whose bytes failed their checksum.", a),
      r.add_counter("shoal_engine_handoffs_refused_format_total", "Handoffs refused: their KV blocks are in another format.", a),
      r.add_counter("shoal_engine_storage_format_misses_total", "Storage reads that stopped at a block of another KV format.", a),
      r.add_gauge("shoal_storage_usage_bytes", "Bytes of chunks a storage node holds.", a),
      r.add_gauge("shoal_storage_capacity_bytes", "A storage node's capacity.", a),
      r.add_gauge("shoal_storage_chunks", "Chunks a storage node holds.", a),
      r.add_counter("shoal_storage_puts_total", "Chunk puts.", a),
      r.add_counter("shoal_storage_gets_total", "Chunk gets.", a),
      r.add_counter("shoal_storage_gc_evicted_chunks_total", "Chunks evicted by GC over the high watermark.", a),
      r.add_counter("shoal_storage_ttl_expired_chunks_total", "Chunks removed by the TTL sweep.", a),
      r.add_counter("shoal_storage_put_seconds_total", "Seconds spent in successful chunk puts (fsync included).", a),
      r.add_counter("shoal_storage_get_seconds_total", "Seconds spent in chunk gets that found their chunk.", a),
      r.add_counter("shoal_storage_get_hits_total", "Chunk gets that found their chunk.", a),
      r.add_counter("shoal_prefill_balancer_placements_total", "Requests the prefill balancer placed on an engine.", "engine"),
      r.add_counter("shoal_prefill_balancer_tier_placements_total", "Requests the prefill balancer placed, by context tier.", "tier"),
      r.add_counter("shoal_decode_balancer_placements_total", "Handoffs the decode balancer placed on a decode engine.", "engine"),
      r.add_gauge("shoal_decode_balancer_balance_ratio", "Mean over max of the decode engines' (requests, KV) load.", "window"),
      r.add_gauge("shoal_engine_experts_resident", "Routed experts this process holds in memory (partitioned expert weights).", a),
      r.add_gauge("shoal_engine_experts_resident_bytes", "Bytes of the routed experts this process holds.", a),
      r.add_gauge("shoal_ep_group_ranks", "Ranks in the expert-parallel group this process's ranks are in now.", a),
      r.add_counter("shoal_ep_frames_sent_total", "Expert-parallel frames sent, by path (bulk transport or inline).", "path"),
      r.add_counter("shoal_ep_expert_bytes_read_total", "Routed-expert weight bytes a rank adopted, by source (memory of this process, holder process, checkpoint).", "source"),
      r.add_counter("shoal_ep_expert_read_failures_total", "Reads of routed experts from a holder that failed (read from the checkpoint instead).", a),
      r.add_counter("shoal_transport_reads_total", "Ranges the bulk transport read, by path (shm within the host, or the network provider).", "path"),
      r.add_gauge("process_resident_memory_bytes", "Resident memory size of this process in bytes.", ""),
  };
}

}  // namespace shoal::runtime
