"""The machine a trial runs on: CPU facts, CPU placement of server and client, child processes."""
