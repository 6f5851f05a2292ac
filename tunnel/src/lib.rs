//! Native Cloudflare Tunnel connector and a mock edge.
