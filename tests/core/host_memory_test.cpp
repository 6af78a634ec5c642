// kiln::keep_freed_step_memory against glibc's own accounting (mallinfo2): with glibc's
// defaults a large block is mapped on its own and unmapped when freed, which the first half
// shows so that the second half can fail; after the call, the same block comes from the heap
// and its memory stays there, free, for the next step. Each doctest case runs in a process of
// its own (ctest), so the process-wide setting reaches no other test.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

TEST_SUITE("host memory") {
  TEST_CASE("keep_freed_step_memory: a 64 MiB block comes from the heap and stays there when freed") {
#ifndef __GLIBC__
    CHECK_FALSE(kiln::keep_freed_step_memory());
#else
    if (const char* t = std::getenv("GLIBC_TUNABLES"); t && std::strstr(t, "glibc.malloc.")) {
      CHECK_FALSE(kiln::keep_freed_step_memory());  // the user's setting wins
      return;
    }
    // Above glibc's largest dynamic mmap threshold (32 MiB), so the default maps it every time.
    constexpr std::size_t block = std::size_t{64} << 20;
    auto touch = [](void* p) { static_cast<volatile char*>(p)[block - 1] = 1; };  // not elided
    const auto mapped = [] { return ::mallinfo2().hblkhd; };

    std::size_t before = mapped();
    void* p = std::malloc(block);
    touch(p);
    CHECK(mapped() - before >= block);  // glibc's default: a mapping of its own
    std::free(p);
    CHECK(mapped() == before);  // and gone on free: the next step faults it in again

    REQUIRE(kiln::keep_freed_step_memory());
    before = mapped();
    p = std::malloc(block);
    touch(p);
    CHECK(mapped() == before);  // from the heap
    std::free(p);
    CHECK(::mallinfo2().fordblks >= block);  // kept, free, rather than trimmed
#endif
  }
}
