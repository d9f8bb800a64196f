// Package upgrade holds nothing itself: its packages coordinate a driver change between the nodes of a pool.
//   - nodestate: the vocabulary the stack writes on Nodes (the upgrade states, marks, cordons) and its patches;
//   - driverpools: which driver pool, and which of its DaemonSets, a node belongs to;
//   - canary: the canary first, then the pool widening, and its failure threshold;
//   - slots: the pool's bound on nodes out of service at once;
//   - revertset: the copy of a driver DaemonSet a node whose new driver failed goes back to.
package upgrade
