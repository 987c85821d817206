package proxy

// dataplane is where plans go: the kernel's table on Linux.
type dataplane interface {
	// observe reads the table as the kernel has it (chains without their
	// rules; static sets with their elements when want has them).
	observe(want *table) (*table, error)
	// apply writes a plan as one transaction.
	apply(*plan) error
	// deleteTable removes the whole table.
	deleteTable() error
	// deleteFlows deletes the conntrack entries the filters select.
	deleteFlows([]flowFilter) (uint, error)
	close() error
}
