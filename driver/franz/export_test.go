package franz

// HeartbeatClientsOpen is how many heartbeat clients c's electors share now.
func HeartbeatClientsOpen(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.beats)
}
