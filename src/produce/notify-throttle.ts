// In util/: the lease store throttles the wake-ups of follow-up inserts the same way publish does.
export { NotifyThrottle, type NotifyThrottleOptions } from "../util/notify-throttle.js";
