// Intentionally empty: specstream_testing_torch_pch exists for its
// precompiled header (tests/testing/CMakeLists.txt), which test targets reuse.
