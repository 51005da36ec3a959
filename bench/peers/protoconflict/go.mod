module a.peers.local/protoconflict

go 1.26.0
