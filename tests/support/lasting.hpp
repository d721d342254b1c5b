#pragma once
// Objects a test process keeps until it ends. CAF 0.17 cannot always take down two actor
// systems of one process that have talked over the middleman: ~actor_system can wait for good
// on a detached actor, and the BASP brokers can leave a reference cycle (LeakSanitizer reports
// it). shoald never destroys its system for the same reason (it leaves by _Exit). Tests that
// connect systems in-process keep them here; main (tests/doctest_main.cpp) then runs the leak
// check itself and leaves by _Exit, so no destructor of theirs runs at all.

namespace shoal::test {

// Tells main that this process holds lasting objects; called by `lasting`.
void keep_until_exit();

// One `T`, built on first use, never destroyed; reachable, so not a leak.
template <class T>
T& lasting() {
  static T* object = (keep_until_exit(), new T());
  return *object;
}

}  // namespace shoal::test
