"""Bearer tokens, TLS and the call guard; state files only their owner reads; text from peers made safe to log."""
