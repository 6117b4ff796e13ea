// One accepted HTTP/1.1 connection. Internal to src/server (server.cpp creates them); the
// Beast code stays in http_connection.cpp.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include "server/server_state.h"

namespace tetra::server {

// Takes over `socket` (whose executor is a strand) and serves requests until the client
// leaves, a timeout fires or the server stops.
void start_connection(boost::asio::ip::tcp::socket socket, ServerState& state);

}  // namespace tetra::server
