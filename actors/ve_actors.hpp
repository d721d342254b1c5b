// The vision-encoder pool: a worker actor per ve node over runtime::ve_worker (detached: the
// encoder runs on its own thread, its mailbox is the queue), and the VE balancer actor of a
// gateway node over runtime::ve_balancer. The balancer learns the workers from the
// membership (nodes with a ve_worker), monitors them, and places each encode job (a request's
// images) on the worker with the least patches queued; a job whose worker dies, drains or
// fails it is placed again on another, and an answer from an older placement is ignored.
#pragma once

#include <chrono>
#include <memory>

#include "actors/interfaces.hpp"
#include "runtime/vision/ve_worker.hpp"

namespace shoal::actors {

ve_worker_actor spawn_ve_worker(caf::actor_system& sys, std::string node, std::unique_ptr<runtime::ve_worker> worker);

struct ve_balancer_options {
  std::chrono::milliseconds timeout{60'000};  // one worker's answer to one job
  int max_placements = 4;                     // workers tried per job before giving up
};

ve_balancer_actor spawn_ve_balancer(caf::actor_system& sys, ve_balancer_options options);

}  // namespace shoal::actors
