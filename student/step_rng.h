// The per-sample random streams a training step draws on the host (block
// drafts' anchors, P-EAGLE's COD rows): keyed by (seed, step, sample key)
// only, so every rank of a job and a resumed run draw the same, and the
// same on every platform (no std:: distribution, whose output is
// implementation-defined).
#ifndef SPECSTREAM_STUDENT_STEP_RNG_H_
#define SPECSTREAM_STUDENT_STEP_RNG_H_

#include <cstdint>
#include <random>
#include <vector>

namespace specstream::student {

// The stream of sample `sample_key` at `step` of a job seeded `seed`.
std::mt19937_64 StepRng(uint64_t seed, int64_t step, int64_t sample_key);

// Uniform in [0, n), n > 0, by rejection (no modulo bias).
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n);

// A uniform subset of `n` of `candidates` (all of them when n >= their
// count), ascending.
std::vector<int64_t> UniformSubset(std::vector<int64_t> candidates, int64_t n,
                                   std::mt19937_64& rng);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_STEP_RNG_H_
