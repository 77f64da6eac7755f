package deps
import (
 _ "github.com/cilium/ebpf"
 _ "github.com/vishvananda/netlink"
 _ "github.com/vishvananda/netns"
 _ "github.com/mdlayher/genetlink"
)
