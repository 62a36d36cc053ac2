"""Bearer tokens, TLS and the call guard; state files only their owner reads; files a user named
written whole and never through a symlink; text from peers made safe to log."""
