// Payload encoding lives in contract/: follow-ups (dispatch/) validate exactly as publish does.
export { DEFAULT_MAX_PAYLOAD_BYTES, encodePayload } from "../contract/payload.js";
