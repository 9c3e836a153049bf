package netfence

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
)

// ipv6Gateways returns the gateways of the pod's IPv6 routes, each once, as the kernel (or
// gVisor's netstack) answers RTM_GETROUTE: a route's RTA_GATEWAY and its RTA_MULTIPATH hops'.
func ipv6Gateways() ([]netip.Addr, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETROUTE, syscall.AF_INET6)
	if err != nil {
		return nil, fmt.Errorf("reading the IPv6 routes for their gateways: %v", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, fmt.Errorf("reading the IPv6 routes for their gateways: %v", err)
	}
	var gateways []netip.Addr
	add := func(value []byte) {
		if len(value) != 16 {
			return
		}
		if a := netip.AddrFrom16([16]byte(value)).Unmap(); a.Is6() && !slices.Contains(gateways, a) {
			gateways = append(gateways, a)
		}
	}
	for i := range msgs {
		// A kernel without IPv6 may answer with every family's routes: rtm_family says which.
		if msgs[i].Header.Type != syscall.RTM_NEWROUTE || len(msgs[i].Data) == 0 || msgs[i].Data[0] != syscall.AF_INET6 {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&msgs[i])
		if err != nil {
			return nil, fmt.Errorf("reading the IPv6 routes for their gateways: %v", err)
		}
		for _, a := range attrs {
			switch a.Attr.Type {
			case syscall.RTA_GATEWAY:
				add(a.Value)
			case syscall.RTA_MULTIPATH:
				for _, g := range multipathGateways(a.Value) {
					add(g)
				}
			}
		}
	}
	return gateways, nil
}

// multipathGateways reads the RTA_GATEWAY of each struct rtnexthop (len u16, flags, hops,
// ifindex i32, then its attributes) of an RTA_MULTIPATH; a malformed one ends the list.
func multipathGateways(b []byte) [][]byte {
	const rtnexthopSize, rtattrSize = 8, 4
	align := func(n int) int { return (n + 3) &^ 3 }
	var gateways [][]byte
	for len(b) >= rtnexthopSize {
		hopLen := int(binary.NativeEndian.Uint16(b))
		if hopLen < rtnexthopSize || hopLen > len(b) {
			break
		}
		attrs := b[rtnexthopSize:hopLen]
		for len(attrs) >= rtattrSize {
			attrLen := int(binary.NativeEndian.Uint16(attrs))
			if attrLen < rtattrSize || attrLen > len(attrs) {
				break
			}
			if binary.NativeEndian.Uint16(attrs[2:]) == syscall.RTA_GATEWAY {
				gateways = append(gateways, attrs[rtattrSize:attrLen])
			}
			attrs = attrs[min(align(attrLen), len(attrs)):]
		}
		b = b[min(align(hopLen), len(b)):]
	}
	return gateways
}
