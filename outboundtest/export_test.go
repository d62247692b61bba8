package outboundtest

// QueuedBusy reports how many of the workers of Queued faults of the given
// capacity are taken.
func QueuedBusy(s *Server, capacity int) int { return capacity - len(s.workerPool(capacity)) }
