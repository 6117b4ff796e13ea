// What the communicators of ranks that are threads of one process need from the CUDA runtime:
// the calling thread's device put back after a detour, and the GPUs' access to each other's
// memory.
#pragma once

#include <vector>

namespace tetra::parallel {

// Puts the calling thread's current device back on scope exit (a communicator is made and
// destroyed on threads that may drive another device).
class RestoreDevice {
 public:
  RestoreDevice();
  ~RestoreDevice();
  RestoreDevice(const RestoreDevice&) = delete;
  RestoreDevice& operator=(const RestoreDevice&) = delete;

 private:
  int device_ = -1;
};

// Whether every GPU of `devices` can read every other's memory (true for one GPU, listed once
// or more).
bool peers_reach_each_other(const std::vector<int>& devices);
// Lets every GPU of `devices` read every other's memory; throws where one cannot.
void enable_peer_access(const std::vector<int>& devices);
// Throws unless every entry names a CUDA device of this machine.
void check_devices_exist(const std::vector<int>& devices);

}  // namespace tetra::parallel
