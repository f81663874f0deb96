// find_wait_cycle's search (torch_fr_analysis.cpp): the shortest ring of waits through a culprit, on the
// graph of who waits on whom that it builds (ranks, and one node per newest seq of each group).
#pragma once

#include <algorithm>      // std::fill, std::reverse
#include <cstddef>        // std::size_t
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair
#include <vector>         // std::vector

namespace sb {

// An edge of find_wait_cycle's graph: label indexes its labels (a rank's wait), -1 a seq's chain.
struct WaitEdge {
  int to, label;
};

// The shortest ring of waits through one of the first 16 culprits: breadth first from each, back to it.
// (rank node, the label of the edge leaving it) around the ring; empty where none closes.
inline std::vector<std::pair<int, int>> shortest_ring(const std::vector<std::vector<WaitEdge>>& out,
                                                      const std::vector<int>& rank_of,
                                                      const std::unordered_map<int, int>& node_of,
                                                      const std::vector<int>& culprits) {
  std::vector<std::pair<int, int>> best;  // (rank node, its label) around the ring
  std::vector<std::pair<int, int>> parent(out.size());
  std::vector<char> seen(out.size());
  std::vector<int> queue;
  std::size_t tried = 0;
  for (int c : culprits) {
    if (!node_of.count(c)) continue;
    if (tried++ == 16) break;
    const int start = node_of.at(c);
    std::fill(seen.begin(), seen.end(), 0);
    queue.assign(1, start);
    seen[std::size_t(start)] = 1;
    int closing = -1, closing_label = -1;  // the edge back to the start
    for (std::size_t q = 0; q < queue.size() && closing < 0; ++q) {
      const int u = queue[q];
      for (const WaitEdge& e : out[std::size_t(u)]) {
        if (e.to == start) {
          closing = u;
          closing_label = e.label;
          break;
        }
        if (seen[std::size_t(e.to)]) continue;
        seen[std::size_t(e.to)] = 1;
        parent[std::size_t(e.to)] = {u, e.label};
        queue.push_back(e.to);
      }
    }
    if (closing < 0) continue;
    // walk back from the closing edge; a rank's label is that of the edge leaving it
    std::vector<std::pair<int, int>> ring;
    int node = closing, label = closing_label;
    for (;;) {
      if (rank_of[std::size_t(node)] >= 0) ring.emplace_back(node, label);
      if (node == start) break;
      label = parent[std::size_t(node)].second;
      node = parent[std::size_t(node)].first;
    }
    std::reverse(ring.begin(), ring.end());
    if (ring.size() >= 2 && (best.empty() || ring.size() < best.size())) best = std::move(ring);
  }
  return best;
}

}  // namespace sb
