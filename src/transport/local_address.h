// Which of this machine's addresses reaches a given host (issue 15, "Addresses across machines"): the source address
// the kernel's routing picks for a UDP socket connected to it. Nothing is sent (connecting a UDP socket only routes).
// A learner advertises this address to its peers, so on several machines they dial it instead of 127.0.0.1.
#pragma once

#include <string>

namespace dloco {

/// This machine's address on the route to `host_port` ("host:port" or "[v6]:port"; the host may be a name): e.g.
/// "10.0.0.2" for a syncer at 10.0.0.1, "127.0.0.1" for one on loopback. "" when the host does not resolve or no
/// route leads there.
std::string local_address_towards(const std::string& host_port);

/// This machine's one IPv4 address off loopback on an interface that is up (e.g. "10.0.0.2"), or "" when it has
/// none or several (then only the user knows which one its peers reach). For a rendezvous host that resolves to
/// loopback here, as Debian maps a machine's own name to 127.0.1.1.
std::string sole_machine_address();

/// Whether `host` is a wildcard ("", "0.0.0.0", "::", "[::]"): listen on every interface.
bool is_wildcard_host(const std::string& host);

/// Whether `host` is this machine's loopback ("127.x.y.z", "localhost", "::1", "[::1]").
bool is_loopback_host(const std::string& host);

}  // namespace dloco
